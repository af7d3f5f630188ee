"""Attaching autocomp to a model: ``wrap(ddp)``, and ``make_hook(config)`` for frameworks.

Both end in :func:`bind`: parameter slots keyed by name, the cross-rank check that every rank
holds the same model and configuration, the adaptive loop (rank 0's run log and calibration
included) and the :class:`~autocomp.controller.Controller`. ``wrap`` binds at once and
registers the hook itself. ``make_hook`` returns a ``(state, hook)`` pair a framework
registers on the DDP model it builds (``ddp.register_comm_hook(state, hook)``, Lightning's
``DDPStrategy(ddp_comm_state=state, ddp_comm_hook=hook)``); the state binds at the hook's
first call, finding the model that registered it, or earlier with ``state.bind(ddp)``.

Every step that can fail on one rank only (a run log rank 0 cannot create, calibration)
ends in :func:`~autocomp.distributed.raise_together`, so a local failure is raised on every
rank before any collective could be left waiting for it.
"""

from __future__ import annotations

import copy
import gc
import glob
import logging
import warnings
import weakref
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from autocomp.adaptive import AdaptiveLoop
from autocomp.compressors import Compressor, build_compressor
from autocomp.config import AutocompConfig, ResolvedConfig
from autocomp.controller import Controller
from autocomp.distributed import raise_together, require_same_on_all_ranks
from autocomp.env import (
    AUTOCOMP_CHECK_WIRE_BYTES,
    AUTOCOMP_DISABLE,
    AUTOCOMP_RUN_DIR,
    AUTOCOMP_SEED,
)
from autocomp.hook import autocomp_hook
from autocomp.hook_hierarchy import HierarchicalReduce, hierarchical_hook
from autocomp.hook_layer import LayerSlot, bucket_shape, is_identity
from autocomp.hook_state import HookState
from autocomp.level_probe import agreed_min_advantage, measure_levels
from autocomp.plan import Plan, assignment_digest
from autocomp.policy.rules import PolicyRules
from autocomp.runlog import RunLog, default_run_dir, new_run_id
from autocomp.topology import (
    build_hierarchy_groups,
    detect_topology,
    release_hierarchy_groups,
    resolve_hierarchy,
)

logger = logging.getLogger(__name__)

__all__ = ["AutocompState", "autocomp_comm_hook", "bind", "make_hook", "wrap"]

_WRAPPED_ATTR = "_autocomp_controller"


class _ControllerLink:
    """A model's strong reference to its controller, left by ``wrap`` and
    :meth:`AutocompState.bind`. It copies and pickles as None: a copy of the model (an EMA
    copy, ``torch.save(model)``) is not bound to autocomp and must not carry a controller."""

    __slots__ = ("controller",)

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def __reduce__(self) -> tuple[type[None], tuple[()]]:
        return (type(None), ())


def _hold_controller(model: torch.nn.Module, controller: Controller) -> None:
    """Make ``model`` keep ``controller`` alive (the mark ``wrap`` checks for a second wrap)."""
    setattr(model, _WRAPPED_ATTR, _ControllerLink(controller))


def layer_seed(base_seed: int, name: str) -> int:
    """Seed shared by all ranks for one parameter (crc32: stable across processes)."""
    return (base_seed * 0x9E3779B1 + zlib.crc32(name.encode())) % (1 << 62)


def _require_distributed() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialized; call dist.init_process_group(...) (torchrun "
            "sets the environment) before creating DDP and calling autocomp.wrap"
        )


def _check_model(model: object) -> DistributedDataParallel:
    if isinstance(model, DistributedDataParallel):
        return model
    raise TypeError(
        f"autocomp.wrap expects a DistributedDataParallel model, got {type(model).__name__}; "
        "wrap your module in DistributedDataParallel first: "
        "ddp = torch.nn.parallel.DistributedDataParallel(model); ctl = autocomp.wrap(ddp)"
    )


def _open_run_log(
    run_dir: str | Path | bool | None,
    params: dict[str, torch.nn.Parameter],
    rules: PolicyRules,
    config: AdaptiveLoop.Config,
    world_size: int,
) -> RunLog:
    run_id = new_run_id()
    if run_dir is None or run_dir is True:
        configured = AUTOCOMP_RUN_DIR.get()
        directory = Path(configured) / run_id if configured else default_run_dir(run_id)
    else:
        directory = Path(run_dir)
    meta = {
        "world_size": world_size,
        "policy": rules.name,
        "target_overlap": config.target_overlap,
        "window": config.window,
        "warmup_steps": config.warmup_steps,
        "layers": [
            {"name": n, "shape": list(p.shape), "numel": p.numel(), "dtype": str(p.dtype)}
            for n, p in params.items()
        ],
    }
    log = RunLog.open(directory, run_id=run_id, meta=meta)
    logger.info("autocomp: run log at %s", directory / "run.db")
    return log


class _JoinGuard:
    """Stands in for a wrapped DDP model's ``join`` and ``join_hook``.

    DDP's join() shadows a finished rank's all-reduces with plain ones of each bucket's full
    size; the compressed hook issues other collectives, so they would mismatch. Once the
    controller is closed (the hook then sends each bucket with one plain all-reduce), and on a
    copy of the model (``copy.deepcopy``, ``torch.save``: a copy has no autocomp hook), it is
    DDP's own method. A class, not a closure, so the model still pickles.
    """

    __slots__ = ("_model", "_name")

    def __init__(self, model: DistributedDataParallel | None, name: str) -> None:
        self._model = weakref.ref(model) if model is not None else None
        self._name = name

    def __reduce__(self) -> tuple[type[_JoinGuard], tuple[Any, str]]:
        return (_JoinGuard, (self._model() if self._model is not None else None, self._name))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self._model() if self._model is not None else None
        if model is None:
            raise RuntimeError("autocomp: join() on a DDP model that no longer exists")
        link = getattr(model, _WRAPPED_ATTR, None)
        if link is not None and not link.controller.closed:
            raise RuntimeError(
                "DDP join() (uneven inputs) cannot be used with autocomp: a rank that has "
                "joined shadows the others' gradient all-reduces with uncompressed ones of "
                "each bucket's size, which do not match the compressed collectives. Give every "
                "rank the same number of batches (e.g. DistributedSampler(drop_last=True)), or "
                "close() the controller on every rank before join()."
            )
        return getattr(DistributedDataParallel, self._name)(model, *args, **kwargs)


def _refuse_join(ddp: torch.nn.Module) -> None:
    if isinstance(ddp, DistributedDataParallel):
        ddp.join = _JoinGuard(ddp, "join")  # type: ignore[method-assign]
        ddp.join_hook = _JoinGuard(ddp, "join_hook")  # type: ignore[method-assign]


def bind(
    model: torch.nn.Module,
    resolved: ResolvedConfig,
    process_group: dist.ProcessGroup | None,
) -> Controller:
    """Build the hook state and controller of ``model`` (a collective: every rank, in order).

    ``model`` is the DDP wrapper or the module whose parameters it reduces; names come from
    its ``named_parameters()`` (the DDP wrapper's ``module.`` prefix is dropped).
    """
    source = resolved.source
    rank = dist.get_rank(process_group)
    world_size = dist.get_world_size(process_group)
    module = model.module if isinstance(model, DistributedDataParallel) else model
    ignored = ddp_ignored_names(model, module)
    params = {n: p for n, p in module.named_parameters() if p.requires_grad and n not in ignored}
    sparse = sparse_gradient_names(module, params)
    rules = resolved.rules
    problem: Exception | None = None
    if not params:
        problem = ValueError("the model has no parameters that require gradients; nothing to wrap")
    elif other_hook := foreign_comm_hook(model):
        problem = RuntimeError(other_hook)
    elif pinned := sorted(n for n, c in rules.resolve(sparse).items() if not is_identity(c)):
        problem = ValueError(
            f"autocomp plan: {', '.join(pinned)} get sparse gradients (an embedding with "
            "sparse=True), which are sent as DDP sends them and never compressed; pin them "
            "to 'none' or leave them out of the plan"
        )
    raise_together(problem, process_group, "autocomp setup")
    for pattern in rules.unmatched_patterns(params):
        message = f"autocomp plan: glob {pattern!r} matches no parameter of the model"
        warnings.warn(message, UserWarning, stacklevel=3)
        logger.warning(message)
    base_seed = AUTOCOMP_SEED.get() if source.seed is None else int(source.seed)
    disabled = AUTOCOMP_DISABLE.get()
    if disabled:
        logger.warning("AUTOCOMP_DISABLE is set: every layer uses plain all-reduce")
    adaptive = resolved.adaptive and not disabled
    if resolved.adaptive or disabled:
        # Adaptive mode starts uncompressed (warm-up); the policy switches layers later.
        assignment: dict[str, Compressor] = {name: build_compressor("none") for name in params}
    else:
        assignment = rules.resolve(params)

    shapes: dict[str, object] = {n: p.shape for n, p in params.items()}
    # Everything else ranks must agree on rides along as pseudo-entries of the digest.
    settings = {
        "\0seed": (base_seed, world_size),
        "\0config": (*resolved.digest_fields(), disabled),
    }
    digest = assignment_digest(
        {**assignment, **{key: build_compressor("none") for key in settings}},
        {**shapes, **settings},
    )
    require_same_on_all_ranks(digest, process_group, "the autocomp configuration (or the model)")

    slots = {
        name: LayerSlot(
            name=name,
            shape=shape,
            dtype=dtype,
            seed=layer_seed(base_seed, name),
            sparse=name in sparse,
        )
        for name, p in params.items()
        for shape, dtype in [bucket_shape(p)]
    }
    state = HookState(
        process_group,
        slots,
        {id(p): name for name, p in params.items()},
        rank=rank,
        world_size=world_size,
        check_wire_bytes=AUTOCOMP_CHECK_WIRE_BYTES.get(),
    )
    state.assign(assignment)
    dense_bytes = sum(p.numel() * p.element_size() for n, p in params.items() if n not in sparse)
    state.hierarchy = _hierarchy(source.hierarchy, process_group, sparse, dense_bytes)
    if not resolved.adaptive and resolved.warmup_steps:
        for slot in slots.values():
            slot.uncompressed_until = resolved.warmup_steps
    loop = None
    if adaptive:
        loop = _adaptive_loop(model, state, resolved, params, process_group)
    controller = Controller(model, state, rules, params, loop)
    if loop is not None and source.dashboard and rank == 0 and loop.runlog is not None:
        port = 8765 if source.dashboard is True else int(source.dashboard)
        controller._start_dashboard(loop.runlog.path.parent, port)
    _refuse_join(model)
    if rank == 0:
        compressed = sum(1 for c in assignment.values() if c.name != "none")
        detail = (
            f" (policy {loop.rules.name}, target overlap {loop.config.target_overlap}, "
            f"window {loop.config.window}, warm-up {loop.config.warmup_steps} steps)"
            if loop is not None
            else f", {compressed} compressed"
        )
        logger.info(
            "autocomp: wrapped %d parameters across %d ranks, %s mode%s",
            len(assignment),
            world_size,
            controller.mode,
            detail,
        )
    return controller


def foreign_comm_hook(model: torch.nn.Module) -> str | None:
    """Why autocomp's hook cannot go on ``model``, when DDP already runs another comm hook.

    DDP takes one hook per model and says so only when the second is registered, after
    :func:`bind`'s collectives; found here, the refusal is raised on every rank together.
    DDP's ``mixed_precision`` option is such a hook (it all-reduces in ``reduce_dtype`` and
    upcasts into the float32 parameters), registered by DDP's constructor.
    """
    if not isinstance(model, DistributedDataParallel):
        return None
    if any(isinstance(state, AutocompState) for _, state in getattr(model, "_comm_hooks", ())):
        # make_hook's pair, binding at its first call: DDP would have refused any other hook,
        # and the logging data below waits on the reducer's lock, which the backward holds.
        return None
    if getattr(model, "mixed_precision", None) is not None:
        return (
            "autocomp cannot wrap a DDP model built with mixed_precision=: DDP reduces such a "
            "model's gradients through its own comm hook, and takes one hook per model. "
            "Train in mixed precision with torch.autocast instead (autocomp compresses the "
            "float32 gradients), or leave this model unwrapped"
        )
    try:
        name = model._get_ddp_logging_data().get("comm_hook")
    except (AttributeError, RuntimeError):  # older torch, or a reducer not built
        return None
    if not name:
        return None
    return (
        f"autocomp cannot wrap this DDP model: it already has a comm hook ({name}), and DDP "
        "takes one hook per model. Remove the other register_comm_hook call"
    )


def ddp_ignored_names(model: torch.nn.Module, module: torch.nn.Module) -> set[str]:
    """Parameters DDP never hands a comm hook: those set aside with
    ``DDP._set_params_and_buffers_to_ignore_for_model`` and, on the DDP wrapper, its
    ``delay_all_reduce_named_params`` (all-reduced by DDP itself after the backward). Left in,
    they were planned and reported as if compressed, and the policy priced bytes that never
    cross the link."""
    if isinstance(model, DistributedDataParallel):
        return set(getattr(model, "parameters_to_ignore", ()))
    return set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))


def sparse_gradient_names(module: torch.nn.Module, params: Mapping[str, Any]) -> list[str]:
    """Parameters whose gradient DDP hands the hook as a sparse tensor: the weights of
    ``nn.Embedding`` and ``nn.EmbeddingBag`` built with ``sparse=True`` (DDP's own test).
    Each sits alone in its bucket; the hook all-reduces it as DDP would (gloo sums sparse
    tensors) and never compresses it, since no compressor here takes a sparse tensor."""
    names = []
    for prefix, sub in module.named_modules():
        if isinstance(sub, torch.nn.Embedding | torch.nn.EmbeddingBag) and sub.sparse:
            name = f"{prefix}.weight" if prefix else "weight"
            if name in params:
                names.append(name)
    return names


def sparse_pins(names: Iterable[str]) -> list[tuple[str, str]]:
    """Exact-name pins that keep sparse gradients uncompressed, for the engine's pin list
    (ahead of the plan's): the live controller's and the advisor's adaptive plan alike."""
    return [(glob.escape(name), "none") for name in names]


def _hierarchy(
    setting: str | bool,
    group: dist.ProcessGroup | None,
    sparse: list[str] | None = None,
    dense_bytes: int = 0,
) -> HierarchicalReduce | None:
    """The two-level reduce's runtime when ``setting`` asks for it and the job has the nodes
    (collective; the same answer, or the same error, on every rank). The two-level reduce
    stages dense buckets; a model with sparse gradients stays flat (``True``: an error).

    ``"auto"`` also times both links (:mod:`autocomp.level_probe`, probes up to
    ``dense_bytes``, the gradients' size) and stays flat unless the link inside a node is
    ``AUTOCOMP_NODE_LINK_MIN_ADVANTAGE`` times faster than the one between nodes."""
    if setting is False:
        return None
    if sparse and setting is True:  # every rank has the same model (checked): same error
        raise ValueError(
            f"hierarchy=True: {', '.join(sparse)} get sparse gradients, which the two-level "
            "reduce cannot stage; use hierarchy=False"
        )
    topology, unknown = detect_topology(group)
    problem: Exception | None = None
    use = False
    if unknown is not None:
        # Every rank holds a reason here, so every rank takes the same branch.
        if setting is True:
            raise ValueError(f"hierarchy=True: cannot tell the nodes apart: {unknown}")
        if dist.get_rank(group) == 0:
            logger.warning("autocomp: hierarchy='auto' falls back to a flat reduce: %s", unknown)
        return None
    try:
        use = resolve_hierarchy(setting, topology, group)  # type: ignore[arg-type]
    except ValueError as err:
        problem = err
    raise_together(problem, group, "autocomp's hierarchy setting")
    if not use:
        if setting == "auto" and topology.num_nodes > 1 and dist.get_rank(group) == 0:
            logger.info("autocomp: %s, flat reduce", topology.describe())
        return None
    if sparse:
        if dist.get_rank(group) == 0:
            logger.warning(
                "autocomp: hierarchy='auto' falls back to a flat reduce: %s get sparse "
                "gradients, which the two-level reduce cannot stage",
                ", ".join(sparse),
            )
        return None
    groups = build_hierarchy_groups(topology)
    min_advantage = agreed_min_advantage(group)
    rates = None
    if setting == "auto" and min_advantage > 0:
        rates = measure_levels(groups, dense_bytes, group)
        if not rates.pays(min_advantage):
            if dist.get_rank(group) == 0:
                logger.info(
                    "autocomp: %s, flat reduce: the link inside a node is not %gx faster than "
                    "the one between nodes (%s), so staging inside the node would cost about "
                    "what it saves; every rank's traffic is compressed instead",
                    topology.describe(),
                    min_advantage,
                    rates.describe(),
                )
            release_hierarchy_groups(groups)
            return None
        if dist.get_rank(group) == 0:
            logger.info("autocomp: %s, two-level reduce: %s", topology.describe(), rates.describe())
    return HierarchicalReduce(
        groups, dist.get_rank(group), min_advantage=min_advantage, opening_rates=rates
    )


def comm_hook_for(state: HookState) -> Any:
    """The comm hook matching ``state``: hierarchical when it has a hierarchy, else flat."""
    return hierarchical_hook if state.hierarchy is not None else autocomp_hook


def _adaptive_loop(
    model: torch.nn.Module,
    state: HookState,
    resolved: ResolvedConfig,
    params: dict[str, torch.nn.Parameter],
    process_group: dist.ProcessGroup | None,
) -> AdaptiveLoop:
    """The window loop; rank 0's run log and calibration fail together with the others."""
    policy = resolved.policy
    assert policy is not None and resolved.window is not None
    assert resolved.target_overlap is not None
    source = resolved.source
    config = AdaptiveLoop.Config(
        target_overlap=resolved.target_overlap,
        window=resolved.window,
        warmup_steps=policy.warmup_steps,
        first_look_steps=source.first_look_steps,
        opening=source.opening,
        sampled_steps=source.sampled_steps,
        quiet_window_seconds=float(source.quiet_window_seconds),
    )
    AdaptiveLoop.validate(config)
    # Sparse gradients are never compressed: exact-name pins ahead of the plan's (which bind
    # has checked do not compress them), so the engine never plans for them.
    pins = sparse_pins(state.sparse_names)
    pins += [(r.pattern, r.compressor.spec) for r in resolved.rules.rules]
    runlog = None
    loop = None
    problem: Exception | None = None
    try:
        if state.rank == 0 and source.run_dir is not False:
            runlog = _open_run_log(source.run_dir, params, policy, config, state.world_size)
        loop = AdaptiveLoop(model, state, policy, pins, config, runlog=runlog)
    except Exception as err:  # rank-local (disk, calibration): every rank must hear of it
        problem = err
        if runlog is not None:
            runlog.close()
    raise_together(problem, process_group, "autocomp's adaptive setup (run log, calibration)")
    assert loop is not None
    return loop


def wrap(
    model: DistributedDataParallel,
    plan: Plan | Mapping[str, str] | list[tuple[str, str]] | str | None = None,
    *,
    target_overlap: float | None = None,
    policy: str | Path | PolicyRules | None = None,
    window: int | None = None,
    warmup_steps: int | None = None,
    seed: int | None = None,
    run_dir: str | Path | bool | None = None,
    dashboard: bool | int = False,
    hierarchy: str | bool = "auto",
    config: AutocompConfig | None = None,
) -> Controller:
    """Register autocomp's comm hook on ``model`` (in place) and return its controller.

    Two modes:

    * **adaptive** (``wrap(ddp)`` or ``wrap(ddp, target_overlap=0.9)``): at every window
      boundary the controller measures the link and the backward timeline, and the policy
      picks a compressor per layer: the least compression error among the plans that train
      fastest (``docs/policy.md``). ``plan`` rules become pins.
    * **static** (``wrap(ddp, plan=...)`` without ``target_overlap`` or ``policy``): the plan
      is applied as given and never changes.

    The keyword arguments are the fields of :class:`~autocomp.config.AutocompConfig` (see it
    for each one); pass ``config=`` instead to hand over a whole configuration.

    All settings must be equal on every rank; this is checked.

    Raises:
        TypeError: ``model`` is not DDP, or an argument has the wrong type.
        ValueError: a spec, policy or numeric argument is invalid (the message says what is).
        RuntimeError: the model is already wrapped or has another comm hook, or the
            configuration differs between ranks, or a rank-local setup step failed (raised on
            every rank, before any training collective).
    """
    ddp = _check_model(model)
    _require_distributed()
    if getattr(ddp, _WRAPPED_ATTR, None) is not None:
        raise RuntimeError(
            "this DDP model is already wrapped by autocomp; DDP allows one comm hook per model. "
            "Use the controller returned by the first wrap() call."
        )
    given = {
        "plan": plan,
        "target_overlap": target_overlap,
        "policy": policy,
        "window": window,
        "warmup_steps": warmup_steps,
        "seed": seed,
        "run_dir": run_dir,
    }
    if config is not None:
        if any(v is not None for v in given.values()) or dashboard or hierarchy != "auto":
            raise ValueError("pass either config= or the individual settings to wrap, not both")
    else:
        config = AutocompConfig(**given, dashboard=dashboard, hierarchy=hierarchy)
    resolved = config.resolve()
    controller = bind(ddp, resolved, ddp.process_group)
    try:
        ddp.register_comm_hook(controller._state, comm_hook_for(controller._state))
    except RuntimeError as err:
        controller.close()
        raise RuntimeError(
            "could not register autocomp's comm hook: this DDP model already has a comm hook "
            f"(DDP allows only one). Remove the other register_comm_hook call. ({err})"
        ) from None
    _hold_controller(ddp, controller)
    return controller


class AutocompState:
    """The state of the ``(state, hook)`` pair :func:`make_hook` returns.

    It binds to the model at the hook's first call (finding the DDP model it was registered
    on), or when :meth:`bind` is called; ``controller`` is the model's
    :class:`~autocomp.controller.Controller` from then on.

    The state refers to its controller weakly, and the bound model holds it (as ``wrap`` marks
    the models it wraps): DDP's C++ reducer holds this state, and a strong state -> controller
    -> model -> reducer chain is a cycle the garbage collector cannot see into, which kept a
    dropped model alive until the process exited.
    """

    def __init__(self, config: AutocompConfig, process_group: dist.ProcessGroup | None) -> None:
        self.config = config
        self.resolved = config.resolve()  # bad settings fail here, not mid-backward
        self.process_group = process_group
        self._controller: weakref.ref[Controller] | None = None
        self._on_ddp = False
        """Whether the DDP model refuses join() and holds the controller (bound to it, or
        found at the hook's first call after :meth:`bind` was given its inner module)."""

    @property
    def controller(self) -> Controller | None:
        """The bound model's controller (None until the first backward or :meth:`bind`)."""
        return None if self._controller is None else self._controller()

    def __deepcopy__(self, memo: dict[int, Any]) -> AutocompState:
        """An unbound state with the same settings and group (a framework may copy its
        strategy's configuration before registering the hook)."""
        return AutocompState(copy.deepcopy(self.config, memo), self.process_group)

    def __reduce__(self) -> tuple[type[AutocompState], tuple[AutocompConfig, None]]:
        """Pickles unbound, without its group (not serializable): on load it uses the DDP
        model's group, as PyTorch's ``PowerSGDState`` falls back to the default group."""
        return (AutocompState, (self.config, None))

    def bind(self, model: torch.nn.Module) -> Controller:
        """Bind to ``model`` (the DDP model, or the module whose parameters it reduces) now.

        A collective: call it on every rank, before the first backward.
        """
        controller = self.controller
        if controller is not None:
            return controller
        _require_distributed()
        group = self.process_group
        if group is None and isinstance(model, DistributedDataParallel):
            group = model.process_group
        controller = bind(model, self.resolved, group)
        _hold_controller(model, controller)
        self._controller = weakref.ref(controller)
        self._on_ddp = isinstance(model, DistributedDataParallel)
        return controller

    def mark_registered(self, controller: Controller) -> None:
        """After :meth:`bind` was given the inner module: make the DDP model that registered
        this state refuse join() and hold the controller, as a DDP-bound state's model does
        (one scan, at the hook's first call; a model not found is left as it is)."""
        self._on_ddp = True
        model = self._find_model()
        if model is not None:
            _refuse_join(model)
            _hold_controller(model, controller)

    def _find_model(self) -> DistributedDataParallel | None:
        """The DDP model this state was registered on (one scan of the GC's objects)."""
        for obj in gc.get_objects():
            if isinstance(obj, DistributedDataParallel):
                hooks = getattr(obj, "_comm_hooks", ())
                if any(state is self for _, state in hooks):
                    return obj
        return None

    def bind_registered(self) -> Controller:
        """Bind to the DDP model that registered this state (the hook's first call)."""
        model = self._find_model()
        problem = None
        if model is None:
            problem = RuntimeError(
                "autocomp: cannot find the DDP model this hook state was registered on; call "
                "state.bind(model) on every rank before the first backward"
            )
        group = self.process_group if self.process_group is not None else None
        raise_together(problem, group, "autocomp's binding to the model")
        assert model is not None
        return self.bind(model)


def autocomp_comm_hook(state, bucket):  # type: ignore[no-untyped-def]
    """The hook of :func:`make_hook`: binds ``state`` at its first call, then autocomp's hook.

    (Unannotated: DDP checks a hook's annotations and rejects the strings this module's
    ``from __future__ import annotations`` would make of them.)
    """
    controller = state.controller
    if controller is None:
        controller = state.bind_registered()
    elif not state._on_ddp:
        state.mark_registered(controller)
    return comm_hook_for(controller._state)(controller._state, bucket)


def make_hook(
    config: AutocompConfig | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> tuple[AutocompState, Any]:
    """A ``(state, hook)`` pair for ``ddp.register_comm_hook(state, hook)`` or a framework's
    comm-hook slot (Lightning: ``DDPStrategy(ddp_comm_state=state, ddp_comm_hook=hook)``).

    ``config`` defaults to ``AutocompConfig()`` (adaptive, default policy). Settings are
    validated here; binding to the model happens at the first backward (or with
    ``state.bind(model)``), after which ``state.controller`` is the usual controller.
    """
    state = AutocompState(config or AutocompConfig(), process_group)
    return state, autocomp_comm_hook
