"""Compressed replica all-reduce for FSDP2 on a 2-D (replicate, shard) mesh (HSDP).

FSDP2's own HSDP (``fully_shard(module, mesh=mesh_2d)``) reduce-scatters each module's
gradients inside its shard group, then all-reduces the shards across the replicate dimension,
the collective that crosses the slow link between nodes. None of FSDP2's hooks can replace
that all-reduce (measured on torch 2.13; details and the other hooks in ``docs/fsdp.md``):

* ``set_all_reduce_hook`` runs *after* the native HSDP all-reduce, on its output.
* ``set_requires_all_reduce(False)`` keeps the reduce-scatter output in a private
  accumulator and returns before ``param.grad`` is assigned and before the all-reduce hook
  runs: after backward every ``param.grad`` is None.

So :func:`wrap_fsdp` takes a model sharded on the 1-D *shard* sub-mesh
(``fully_shard(module, mesh=mesh["shard"])``), where FSDP2 issues no replica collective at
all, and registers an all-reduce hook on every FSDP module. In 1-D FSDP that hook runs right
after the module's reduce-scatter, with the flat reduce-scatter output (every parameter's
padded local shard, concatenated in FSDP's parameter order), before FSDP divides it (when it
post-divides) and views it as ``param.grad``. The hook averages it across the replicate
group in place, each parameter's shard through its own compressor, with error feedback. The
user's loop stays forward / backward / step.

Per FSDP module the hook issues the DDP hook's exchange (:func:`autocomp.hook.exchange_now`),
in a fixed order that depends only on the plan: PowerSGD's first round (with the plain parts
of its dtype when they are no larger), one all-reduce per other payload dtype, one all-gather
of opaque payloads, then the second rounds (PowerSGD's Q). FSDP
calls the hooks in the same module order on every rank of a replicate group when every rank
runs the same modules; a module skipped on some replicas only breaks that, and the periodic
order check (:mod:`autocomp.fsdp_order`) then fails on every rank.

The per-parameter work is the DDP hook's on :class:`~autocomp.hook_state.HookState` slots
keyed by parameter name, whose shapes are the *local shard* shapes (a shard of a matrix is a
matrix, so PowerSGD compresses the shard's rows x cols view; the residual is per shard).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from autocomp.adaptive import AdaptiveLoop
from autocomp.attach import layer_seed
from autocomp.checkpoint import export_fsdp_state, import_fsdp_state
from autocomp.compressors import Collective, build_compressor
from autocomp.config import AutocompConfig, ResolvedConfig
from autocomp.env import AUTOCOMP_CHECK_WIRE_BYTES, AUTOCOMP_DISABLE, AUTOCOMP_SEED
from autocomp.fsdp_order import ModuleOrderCheck
from autocomp.fsdp_setup import (
    DEFAULT_MATRIX_SPEC,
    WRAPPED_ATTR,
    GroupLayout,
    broadcast_shards,
    build_layouts,
    check_mesh,
    default_assignment,
    fsdp_groups,
    raise_on_mesh,
    require_same_on_mesh,
)
from autocomp.hook import BucketWork, exchange_now
from autocomp.hook_layer import LayerSlot, sample_plain
from autocomp.hook_state import HookState
from autocomp.plan import Plan, assignment_digest, load_plan
from autocomp.policy.rules import PolicyRules
from autocomp.window import WindowRecord

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_MATRIX_SPEC", "FSDPController", "wrap_fsdp"]


def _all_reduce(flat: torch.Tensor, group: dist.ProcessGroup) -> torch.futures.Future:
    return dist.all_reduce(flat, group=group, async_op=True).get_future()


class FSDPController:
    """Handle of a model whose replica all-reduce autocomp compresses (see :func:`wrap_fsdp`).

    Bytes are this rank's, across the replicate dimension only (the shard group's
    reduce-scatter is FSDP's and untouched): ``bytes_sent`` is what this rank handed to the
    replica collectives, ``bytes_raw`` what FSDP's uncompressed HSDP all-reduce would have
    sent for the same shards (padding excluded on both sides).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Settings of :func:`wrap_fsdp`; every rank must pass equal values (checked)."""

        seed: int | None = None
        """Base seed of shared random choices (default ``AUTOCOMP_SEED`` or 0)."""
        warmup_steps: int | None = None
        """Steps sent uncompressed at the start (the first gradients are the least stable);
        None: 0 with a static plan, the policy's warm-up in adaptive mode."""
        broadcast_parameters: bool = True
        """Copy replica 0's parameter shards to the other replicas at wrap, as DDP does at
        construction, so replicas that were initialized differently cannot drift apart."""
        check_wire_bytes: bool | None = None
        """Check every payload's size against its compressor (None: the environment's
        ``AUTOCOMP_CHECK_WIRE_BYTES``)."""
        order_check_every: int = 50
        """Backwards between checks that every rank reduced the FSDP modules in the same
        order (:mod:`autocomp.fsdp_order`; two tiny all-reduces and one host read each);
        0 turns the check off."""

    def __init__(
        self,
        model: torch.nn.Module,
        state: HookState,
        layouts: list[GroupLayout],
        plan: Plan,
        order_check: ModuleOrderCheck,
    ) -> None:
        self._model = model
        self._state = state
        self._layouts = layouts
        self._rules = plan
        self._in_step = False
        self._closed = False
        self._layout_index = {id(layout): i for i, layout in enumerate(layouts)}
        self.order_check = order_check
        """The modules' reduce order, compared across the mesh."""
        self.adaptive: AdaptiveLoop | None = None
        """The window loop when the policy decides (``target_overlap`` or ``policy`` given)."""
        self.mesh_shape: tuple[int, ...] = ()
        """The (replicate, shard) mesh's shape; a checkpoint resumes only on the same one."""
        self._groups: list[dist.ProcessGroup] = []
        """The mesh's replicate and shard groups, for failures raised on every rank."""

    # ---- reading ----------------------------------------------------------------------------

    @property
    def plan(self) -> dict[str, str]:
        """Every parameter's compressor spec."""
        return {name: slot.compressor.spec for name, slot in self._state.slots.items()}

    @property
    def step(self) -> int:
        """Backward passes whose gradients crossed the replicate dimension."""
        return self._state.step

    @property
    def replicate_size(self) -> int:
        return self._state.world_size

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank sent across the replicate dimension, all steps."""
        return sum(slot.bytes_sent for slot in self._state.slots.values())

    @property
    def bytes_raw(self) -> int:
        """Bytes an uncompressed replica all-reduce would have sent, all steps."""
        return sum(slot.bytes_raw for slot in self._state.slots.values())

    @property
    def nonfinite_events(self) -> list[tuple[int, str]]:
        """(step, parameter) of every non-finite average (error feedback reset for it)."""
        return list(self._state.nonfinite_events)

    def stats(self) -> dict[str, Any]:
        """Bytes across the replicate dimension, in total and per parameter (local shard)."""
        layers = {
            name: {
                "compressor": slot.compressor.spec,
                "shard_shape": list(slot.shape),
                "wire_bytes_per_step": slot.wire_bytes(),
                "uncompressed_bytes_per_step": slot.numel * slot.dtype.itemsize,
                "bytes_sent": slot.bytes_sent,
                "bytes_uncompressed": slot.bytes_raw,
            }
            for name, slot in self._state.slots.items()
        }
        sent, raw = self.bytes_sent, self.bytes_raw
        return {
            "step": self.step,
            "replicate_size": self.replicate_size,
            "bytes_sent": sent,
            "bytes_uncompressed": raw,
            "compression_ratio": raw / sent if sent else 1.0,
            "layers": layers,
        }

    @property
    def mode(self) -> str:
        return "adaptive" if self.adaptive is not None else "static"

    @property
    def history(self) -> list[WindowRecord]:
        """One record per decision window (adaptive; this replicate group's, rank 0 decides)."""
        return [] if self.adaptive is None else list(self.adaptive.history)

    def observe_loss(self, loss: float | torch.Tensor) -> None:
        """This step's loss, for the divergence guard (adaptive; a tensor is not synced)."""
        if self.adaptive is not None:
            self.adaptive.observe_loss(loss)

    # ---- checkpointing ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """All compression state of this rank, namespaced by its global rank, in a structure
        fixed from ``wrap_fsdp`` on: works with ``torch.save`` (one file per rank) and with
        ``torch.distributed.checkpoint`` (the controller is a ``Stateful``). Format:
        :mod:`autocomp.checkpoint`."""
        return export_fsdp_state(self)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output. A collective over the mesh: a rank that refuses
        (another job, another rank's entry, another mesh) makes every rank raise."""
        problem: Exception | None = None
        try:
            import_fsdp_state(self, state_dict)
        except Exception as err:  # rank-local: every rank must hear of it
            problem = err
        raise_on_mesh(problem, self._groups, "autocomp's FSDP load_state_dict")

    # ---- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop compressing: from the next backward the hook does a plain averaging
        all-reduce (FSDP's module must still be averaged across replicas, so the hook stays).
        Residuals are dropped. Call it on every rank between the same two steps. Idempotent.
        """
        if self._closed:
            return
        if self.adaptive is not None:
            self.adaptive.close()
        self._state.disable()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        compressed = sum(1 for spec in self.plan.values() if spec != "none")
        return (
            f"<autocomp.FSDPController step={self.step} layers={len(self.plan)} "
            f"compressed={compressed} replicas={self.replicate_size}>"
        )

    # ---- the hook ---------------------------------------------------------------------------

    def _begin_step(self) -> None:
        """First hook call of a backward: last step's non-finite flags (before any collective
        of this step, identically on every replica), and a callback at the end of backward
        that counts the step."""
        if self._in_step:
            return
        self._in_step = True
        state = self._state
        state.resolve_nonfinite()
        torch.autograd.Variable._execution_engine.queue_callback(self._end_step)
        if self.order_check.due(state.step):  # before this step's exchanges
            self.order_check.check(state.step)
        if state.step_listener is not None:  # the window boundary, before this step's traffic
            state.step_listener(state.step)

    def _end_step(self) -> None:
        if self._in_step:
            self._in_step = False
            self._state.step += 1
            self.order_check.end_backward()

    def _forward_pre_hook(self, *_: Any) -> None:
        """A backward that raised never ran its end-of-step callback; count it here."""
        if self._in_step:
            logger.warning("autocomp: the previous backward did not finish; counting it ended")
            self.order_check.abandon()  # a partial order says nothing about the replicas
            self._end_step()

    def _reduce(self, layout: GroupLayout, flat: torch.Tensor) -> None:
        """FSDP's all-reduce hook for one module: average ``flat`` across replicas in place."""
        with torch.no_grad():
            self._begin_step()
            if flat.numel() != layout.total or flat.dtype != layout.dtype:
                raise RuntimeError(
                    f"autocomp.wrap_fsdp: FSDP module {layout.module_name!r} reduced "
                    f"{flat.numel()} {flat.dtype} elements, expected {layout.total} "
                    f"{layout.dtype}. The mixed-precision policy must not change after "
                    "wrap_fsdp, and every trainable parameter must get a gradient in every "
                    "backward: wrap_fsdp has FSDP reduce unused ones as zeros where this "
                    "torch can (set_reduce_scatter_unused_params; torch 2.13 has it)."
                )
            profiler = self._state.profiler
            index = self._layout_index[id(layout)]
            self.order_check.record(index)
            entered = profiler.hook_entered(index) if profiler is not None else None
            self._exchange(layout, flat)
            if profiler is not None and entered is not None:
                profiler.hook_exited(entered)

    def _exchange(self, layout: GroupLayout, flat: torch.Tensor) -> None:
        state = self._state
        group = state.process_group
        assert group is not None
        world = state.world_size
        profiler = state.profiler
        sample = profiler is not None and profiler.sample_this_step
        slots = [(s, o) for s, o in zip(layout.slots, layout.offsets, strict=True) if s]
        flat.div_(world)  # summing what the replicas send then yields their average
        if not state.enabled or all(state.sends_plain(s) for s, _ in slots):
            for slot, offset in slots:
                raw = slot.numel * slot.dtype.itemsize
                slot.bytes_sent += raw
                slot.bytes_raw += raw
                if sample and profiler is not None and slot.numel:
                    sample_plain(slot, flat[offset : offset + slot.numel], profiler)
            done = _all_reduce(flat, group)
            if profiler is not None:
                profiler.collective(Collective.ALL_REDUCE, flat.numel() * flat.element_size(), done)
        else:
            work = BucketWork(step=state.step, buffer=flat, group=group, world=world)
            slot_list, offsets = [s for s, _ in slots], [o for _, o in slots]
            done = exchange_now(state, work, slot_list, offsets, sample, blocks_backward=True)
        # FSDP reads the result as soon as this hook returns: the backward waits for the link.
        waiting = profiler.stamp() if profiler is not None else None
        done.wait()
        if profiler is not None and waiting is not None:
            profiler.link_wait(waiting)


def wrap_fsdp(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    plan: Plan | Mapping[str, str] | list[tuple[str, str]] | str | None = None,
    *,
    target_overlap: float | None = None,
    policy: str | Path | PolicyRules | None = None,
    window: int | None = None,
    config: FSDPController.Config | None = None,
) -> FSDPController:
    """Compress ``model``'s gradient all-reduce across the replicate dimension of ``mesh``.

    ``mesh`` is a 2-D ``DeviceMesh``: dim 0 replicates (the slow link between nodes), dim 1
    shards. ``model`` must already be sharded with ``fully_shard(..., mesh=mesh["shard"])``
    (the 1-D shard sub-mesh, root included): FSDP2 reduce-scatters inside each shard group,
    and autocomp's hook then averages every parameter's gradient shard across the replicas,
    through the parameter's compressor with error feedback, before FSDP hands it to
    ``param.grad``. The training loop is unchanged (forward, backward, ``optimizer.step()``).

    ``plan`` maps parameter-name globs to compressor specs, as for :func:`autocomp.wrap`
    (first match wins, unmatched parameters are sent uncompressed). ``None`` means
    ``powersgd:rank=4`` on parameters of two or more dimensions and ``none`` on the rest.

    With ``target_overlap`` or ``policy`` the plan is adaptive, as with :func:`autocomp.wrap`:
    the run starts uncompressed, and at every ``window`` boundary the time-to-accuracy policy
    picks each parameter's compressor from the measured replica link, with ``plan`` rules as
    pins. FSDP's hook must finish before FSDP reads the gradient, so the replica exchange
    cannot hide behind the backward; the window loop measures and plans it as exposed
    (``AdaptiveLoop.Config.blocking_hook``). Each replicate group (one per shard index)
    decides for its own shards, its first rank deciding; the warm-up ends in every group at
    the boundary where one group's measurements end it.

    A collective: call it on every rank of the mesh, after sharding and before the first
    backward. Unless ``config.broadcast_parameters`` is False it copies replica 0's
    parameter shards to the other replicas.

    Raises:
        TypeError: ``mesh`` is not a DeviceMesh, or ``model`` is not sharded by fully_shard.
        ValueError: the mesh is not 2-D, the model is sharded natively as HSDP or on another
            mesh, a trainable parameter is not an FSDP DTensor, or a plan/config value is bad.
        RuntimeError: the model is already wrapped, or ranks disagree on the model, plan or
            config (raised on every rank before any training collective).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized; call init_process_group first")
    mesh = check_mesh(mesh)
    config = FSDPController.Config() if config is None else config
    if not isinstance(config, FSDPController.Config):
        raise TypeError(f"config must be a FSDPController.Config, got {type(config).__name__}")
    warmup = config.warmup_steps
    if warmup is not None and (
        isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0
    ):
        raise ValueError(f"warmup_steps must be an int >= 0, got {warmup!r}")
    every = config.order_check_every
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValueError(f"order_check_every must be an int >= 0, got {every!r}")
    adaptive = target_overlap is not None or policy is not None
    resolved = None
    if adaptive:  # the same validation and policy loading as wrap()
        resolved = AutocompConfig(
            plan=plan,
            target_overlap=target_overlap,
            policy=policy,
            window=window,
            warmup_steps=warmup,
            run_dir=False,
        ).resolve()
    elif window is not None:
        raise ValueError("window= needs adaptive mode (target_overlap= or policy=)")
    if config.seed is not None and (
        isinstance(config.seed, bool) or not isinstance(config.seed, int)
    ):
        raise TypeError(f"seed must be an int, got {config.seed!r}")
    rules = None if plan is None else load_plan(plan)

    replicate_group, shard_group = mesh.get_group(0), mesh.get_group(1)
    groups = [replicate_group, shard_group]
    shard_ranks = dist.get_process_group_ranks(shard_group)
    found, problem = fsdp_groups(model, shard_ranks)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    managed = {id(g_param.sharded_param) for _, _, g in found for g_param in g.fsdp_params}
    if problem is None:
        stray = [n for n, p in params.items() if not isinstance(p, DTensor) or id(p) not in managed]
        if stray:
            problem = ValueError(
                f"parameters {stray[:5]}{' ...' if len(stray) > 5 else ''} are not DTensors "
                "sharded by fully_shard (ignored_params, or modules outside the sharded root); "
                "wrap_fsdp averages only FSDP-managed parameters, so these would diverge "
                "between replicas"
            )
    layouts: list[GroupLayout] = []
    shards: dict[str, tuple[torch.Size, torch.dtype]] = {}
    if problem is None:
        try:
            names = {id(p): n for n, p in params.items()}
            layouts, shards = build_layouts(found, names)
        except Exception as err:  # rank-local: every rank must hear of it
            problem = err
    raise_on_mesh(problem, groups, "autocomp.wrap_fsdp setup")

    if rules is not None:
        for pattern in rules.unmatched_patterns(params):
            logger.warning("autocomp plan: glob %r matches no parameter of the model", pattern)
    disabled = AUTOCOMP_DISABLE.get()
    if disabled:
        logger.warning("AUTOCOMP_DISABLE is set: every parameter uses plain all-reduce")
        assignment = {name: build_compressor("none") for name in params}
    elif adaptive:  # starts uncompressed; the policy switches parameters later
        assignment = {name: build_compressor("none") for name in params}
    elif rules is None:
        assignment = default_assignment(params)
    else:
        assignment = rules.resolve(params)
    base_seed = AUTOCOMP_SEED.get() if config.seed is None else config.seed
    settings = {
        "\0mesh": (
            tuple(mesh.shape),
            base_seed,
            warmup,
            config.broadcast_parameters,
            disabled,
            every,
        ),
        "\0adaptive": () if resolved is None else resolved.digest_fields(),
        "\0plan": (
            None if rules is None else tuple((r.pattern, r.compressor.spec) for r in rules.rules),
        ),
    }
    digest = assignment_digest(
        {**assignment, **{key: build_compressor("none") for key in settings}},
        {**{n: tuple(p.shape) for n, p in params.items()}, **settings},
    )
    require_same_on_mesh(digest, groups, "the autocomp configuration (or the model)")

    slots = {
        name: LayerSlot(name=name, shape=local, dtype=dtype, seed=layer_seed(base_seed, name))
        for name, (local, dtype) in shards.items()
    }
    check = (
        AUTOCOMP_CHECK_WIRE_BYTES.get()
        if config.check_wire_bytes is None
        else config.check_wire_bytes
    )
    state = HookState(
        replicate_group,
        slots,
        {id(p): n for n, p in params.items()},
        rank=dist.get_rank(replicate_group),
        world_size=dist.get_world_size(replicate_group),
        check_wire_bytes=check,
    )
    state.assign(
        {n: c if slots[n].numel else build_compressor("none") for n, c in assignment.items()}
    )
    for slot in slots.values():
        slot.uncompressed_until = 0 if adaptive or warmup is None else warmup
    for layout in layouts:
        layout.slots = [None if name is None else slots[name] for name in layout.names]
    if config.broadcast_parameters:
        broadcast_shards(params, replicate_group)  # type: ignore[arg-type]

    order_check = ModuleOrderCheck([layout.module_name for layout in layouts], groups, every)
    controller = FSDPController(model, state, layouts, rules or Plan(), order_check)
    controller.mesh_shape = tuple(mesh.shape)
    controller._groups = groups
    by_name = {where: module for where, module, _ in found}
    unused_included = True
    for layout in layouts:
        module = by_name[layout.module_name]
        module.set_all_reduce_hook(_bound(controller, layout))
        unused_included = include_unused_parameters(module) and unused_included
    if resolved is not None and not disabled:
        controller.adaptive = _adaptive_loop(model, state, resolved, groups)
    model.register_forward_pre_hook(controller._forward_pre_hook)
    setattr(model, WRAPPED_ATTR, controller)
    if list(mesh.get_coordinate() or ()) == [0, 0]:
        if not unused_included:
            logger.info(
                "autocomp.wrap_fsdp: this torch's FSDP2 cannot reduce unused parameters as "
                "zeros (no set_reduce_scatter_unused_params): every trainable parameter must "
                "get a gradient in every backward, on every replica"
            )
        compressed = sum(1 for c in assignment.values() if c.name != "none")
        logger.info(
            "autocomp: wrap_fsdp over a %s mesh: %d parameters in %d FSDP modules, %d compressed",
            "x".join(map(str, mesh.shape)),
            len(assignment),
            len(layouts),
            compressed,
        )
    return controller


def _adaptive_loop(
    model: torch.nn.Module,
    state: HookState,
    resolved: ResolvedConfig,
    groups: list[dist.ProcessGroup],
) -> AdaptiveLoop:
    """The window loop over the replicate group; a rank-local failure (calibration) is raised
    on every rank of the mesh."""
    policy = resolved.policy
    assert policy is not None and resolved.window is not None
    assert resolved.target_overlap is not None
    loop_config = AdaptiveLoop.Config(
        target_overlap=resolved.target_overlap,
        window=resolved.window,
        warmup_steps=policy.warmup_steps,
        first_look_steps=resolved.source.first_look_steps,
        opening=resolved.source.opening,
        sampled_steps=resolved.source.sampled_steps,
        quiet_window_seconds=float(resolved.source.quiet_window_seconds),
        blocking_hook=True,
    )
    loop = None
    problem: Exception | None = None
    try:
        pins = [(r.pattern, r.compressor.spec) for r in resolved.rules.rules]
        replicate_group, shard_group = groups
        # One replicate group per shard index, each deciding: the warm-up ends in all of them
        # when it ends in one (the shard group hop, then the replicate group's, reaches every
        # group's deciding rank on any mesh layout).
        peers = [shard_group, replicate_group] if dist.get_world_size(shard_group) > 1 else []
        loop = AdaptiveLoop(model, state, policy, pins, loop_config, warmup_peers=peers)
    except Exception as err:  # rank-local: every rank must hear of it
        problem = err
    raise_on_mesh(problem, groups, "autocomp.wrap_fsdp adaptive setup")
    assert loop is not None
    return loop


def include_unused_parameters(module: Any) -> bool:
    """Make FSDP reduce-scatter a zero gradient for a parameter the backward did not reach.

    Replicas must apply the same update. Without this, FSDP leaves an unused parameter out
    of the flat buffer, so a replica that did not use it would hand the hook fewer elements
    than one that did (a rank-local error, while the other replicas wait in the exchange),
    and its gradient would stay None there while the others step it. With it, every replica
    averages the parameter's gradient as zero on the replicas that did not use it, as DDP's
    ``find_unused_parameters`` does. The cost is a reduce-scatter of zeros inside the shard
    group. Returns False on a torch without the setting (2.13 has it, 2.11 does not).
    """
    setter = getattr(module, "set_reduce_scatter_unused_params", None)
    if setter is None:
        return False
    setter(True, recurse=False)
    return True


def _bound(controller: FSDPController, layout: GroupLayout) -> Any:
    def hook(reduce_output: torch.Tensor) -> None:
        controller._reduce(layout, reduce_output)

    return hook
