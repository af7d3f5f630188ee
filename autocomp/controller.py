"""``autocomp.wrap``: attach the unified comm hook to a DDP model and return its controller.

The controller is the user's handle on a wrapped model: the current per-layer plan, traffic
statistics, checkpointing of every piece of compression state, and ``close()``.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import secrets
import subprocess
import warnings
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from autocomp.adaptive import AdaptiveLoop, WindowRecord
from autocomp.compressors import Compressor, build_compressor
from autocomp.distributed import require_same_on_all_ranks
from autocomp.env import (
    AUTOCOMP_CHECK_WIRE_BYTES,
    AUTOCOMP_DISABLE,
    AUTOCOMP_RUN_DIR,
    AUTOCOMP_SEED,
    AUTOCOMP_TOKEN,
)
from autocomp.hook import HookState, LayerSlot, autocomp_hook
from autocomp.plan import Plan, assignment_digest, load_plan
from autocomp.policy.engine import PolicyDecision
from autocomp.policy.rules import PolicyRules, load_policy
from autocomp.runlog import RunLog, default_run_dir, new_run_id

logger = logging.getLogger(__name__)

STATE_DICT_VERSION = 2
_WRAPPED_ATTR = "_autocomp_controller"


def layer_seed(base_seed: int, name: str) -> int:
    """Seed shared by all ranks for one parameter (crc32: stable across processes)."""
    return (base_seed * 0x9E3779B1 + zlib.crc32(name.encode())) % (1 << 62)


class Controller:
    """Handle on a wrapped DDP model. Create it with :func:`wrap`."""

    def __init__(
        self,
        model: DistributedDataParallel,
        state: HookState,
        plan: Plan,
        params: dict[str, torch.nn.Parameter],
        adaptive: AdaptiveLoop | None = None,
    ) -> None:
        self.model = model
        self._state = state
        self._plan_rules = plan
        self._params = params
        self._closed = False
        self.adaptive = adaptive
        """The window loop in adaptive mode (profiler, link fit, cost model, guards, policy)."""
        self.dashboard_url: str | None = None
        """URL of the sidecar this controller started (rank 0, ``dashboard=...``)."""
        self._sidecar: subprocess.Popen[bytes] | None = None

    @property
    def run_dir(self) -> Path | None:
        """Directory of the run log (rank 0, adaptive mode), or None."""
        runlog = None if self.adaptive is None else self.adaptive.runlog
        return None if runlog is None else runlog.path.parent

    def _start_dashboard(self, run_dir: Path, port: int) -> None:
        from autocomp.service.sidecar import (
            SidecarError,
            start_sidecar_process,
            wait_until_healthy,
        )

        token = AUTOCOMP_TOKEN.get() or secrets.token_urlsafe(24)
        host = "127.0.0.1"
        self._sidecar = start_sidecar_process(run_dir, host=host, port=port, token=token)
        atexit.register(self._stop_dashboard)
        url = f"http://{host}:{port}"
        try:
            wait_until_healthy(url, timeout=30.0, process=self._sidecar)
        except SidecarError as err:
            # The dashboard is a convenience: training goes on without it.
            logger.warning("autocomp: the dashboard did not start, training continues: %s", err)
            self._stop_dashboard()
            return
        self.dashboard_url = f"{url}/policy"
        # A console line on rank 0 only: the user asked for the dashboard and needs the URL.
        print(f"autocomp dashboard: {self.dashboard_url}  (overrides token: {token})", flush=True)

    def _stop_dashboard(self) -> None:
        if self._sidecar is not None:
            from autocomp.service.sidecar import stop_sidecar_process

            stop_sidecar_process(self._sidecar)
        self._sidecar = None

    @property
    def mode(self) -> str:
        """``"adaptive"`` (decides per window) or ``"static"`` (the plan given to wrap)."""
        return "static" if self.adaptive is None else "adaptive"

    def observe_loss(self, loss: float | torch.Tensor) -> None:
        """Feed this step's loss to the divergence guard (adaptive mode; no-op when static)."""
        if self.adaptive is not None:
            self.adaptive.observe_loss(loss)

    @property
    def history(self) -> list[WindowRecord]:
        """Window records, oldest first (rank 0 holds decisions and reasons)."""
        return [] if self.adaptive is None else list(self.adaptive.history)

    @property
    def last_decision(self) -> PolicyDecision | None:
        """The policy's latest decision with per-layer reasons (rank 0, adaptive mode)."""
        return None if self.adaptive is None else self.adaptive._last_decision

    # ---- inspection -----------------------------------------------------------------------

    @property
    def plan(self) -> dict[str, str]:
        """Current compressor spec of every parameter, by name (canonical spec strings)."""
        return {name: slot.compressor.spec for name, slot in self._state.slots.items()}

    @property
    def rules(self) -> Plan:
        """The plan rules ``wrap`` was given."""
        return self._plan_rules

    @property
    def step(self) -> int:
        """Optimizer steps whose gradients went through the hook."""
        return self._state.step

    def stats(self) -> dict[str, Any]:
        """Bytes this rank sent versus an uncompressed all-reduce, in total and per layer."""
        layers = {}
        sent = raw = 0
        for name, slot in self._state.slots.items():
            layers[name] = {
                "compressor": slot.compressor.spec,
                "shape": list(slot.shape),
                "wire_bytes_per_step": slot.wire_bytes(),
                "uncompressed_bytes_per_step": slot.numel * slot.dtype.itemsize,
                "bytes_sent": slot.bytes_sent,
                "bytes_uncompressed": slot.bytes_raw,
            }
            sent += slot.bytes_sent
            raw += slot.bytes_raw
        return {
            "step": self._state.step,
            "world_size": self._state.world_size,
            "bytes_sent": sent,
            "bytes_uncompressed": raw,
            "compression_ratio": raw / sent if sent else 1.0,
            "layers": layers,
        }

    # ---- checkpointing --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """All compression state of this rank (error feedback, warm starts, generators).

        Error-feedback residuals differ between ranks: save one file per rank, like optimizer
        state under ZeRO, and load each rank's own file for a bit-identical resume.
        """
        layers = {}
        for name, slot in self._state.slots.items():
            layers[name] = {
                "compressor": slot.compressor.spec,
                "residual": None if slot.residual is None else slot.residual.detach().clone(),
                "state": _export_state(slot.state),
            }
        return {
            "version": STATE_DICT_VERSION,
            "mode": self.mode,
            "rank": self._state.rank,
            "world_size": self._state.world_size,
            "step": self._state.step,
            "layers": layers,
            "adaptive": None if self.adaptive is None else self.adaptive.state_dict(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output; raise ValueError if it belongs to another job."""
        if not isinstance(state_dict, Mapping) or "layers" not in state_dict:
            raise ValueError("not an autocomp state dict (missing 'layers')")
        version = state_dict.get("version")
        if version != STATE_DICT_VERSION:
            raise ValueError(
                f"autocomp state dict version {version!r}; expected {STATE_DICT_VERSION} "
                "(version 1 held PowerSGD's alternating phase and the old window loop)"
            )
        for key, mine in (("world_size", self._state.world_size), ("rank", self._state.rank)):
            if state_dict.get(key) != mine:
                raise ValueError(
                    f"state dict was saved with {key}={state_dict.get(key)}, this process has "
                    f"{key}={mine}; error-feedback residuals are per rank and scaled by the world "
                    "size, so each rank must load its own file from a job of the same size"
                )
        saved = state_dict["layers"]
        mine_names = set(self._state.slots)
        if set(saved) != mine_names:
            missing = sorted(mine_names - set(saved))[:5]
            extra = sorted(set(saved) - mine_names)[:5]
            raise ValueError(
                f"state dict does not match this model: missing {missing}, unexpected {extra}"
            )
        if state_dict.get("mode", "static") != self.mode:
            raise ValueError(
                f"state dict is from a {state_dict.get('mode')} controller, this one is {self.mode}"
            )
        if self.adaptive is not None:
            # The plan is part of the adaptive state: switch to the saved one first.
            self._state.assign(
                {name: build_compressor(entry["compressor"]) for name, entry in saved.items()}
            )
            self.adaptive.load_state_dict(state_dict["adaptive"])
        for name, entry in saved.items():
            spec = build_compressor(entry["compressor"]).spec
            if spec != self._state.slots[name].compressor.spec:
                raise ValueError(
                    f"{name}: state dict was saved with compressor {spec}, this job uses "
                    f"{self._state.slots[name].compressor.spec}; wrap with the same plan to resume"
                )
        for name, entry in saved.items():
            slot = self._state.slots[name]
            device = self._params[name].device
            residual = entry["residual"]
            slot.residual = None if residual is None else residual.detach().to(device).clone()
            slot.state = slot.compressor.init_state(slot.shape, slot.seed, self._state.rank)
            slot.state.update(_import_state(entry["state"]))
        self._state.step = int(state_dict["step"])

    # ---- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop compressing and free compression memory.

        DDP cannot unregister a comm hook, so after ``close()`` the hook stays in place and
        performs a plain averaging all-reduce. Idempotent. Call it on every rank at the same
        step boundary, as with any change to what ranks send.
        """
        if self._closed:
            return
        if self.adaptive is not None:
            self.adaptive.close()
        self._stop_dashboard()
        self._state.enabled = False
        for slot in self._state.slots.values():
            slot.residual = None
            slot.state = {}
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        compressed = sum(1 for spec in self.plan.values() if spec != "none")
        return (
            f"<autocomp.Controller step={self.step} layers={len(self.plan)} "
            f"compressed={compressed}{' closed' if self._closed else ''}>"
        )


def _export_state(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith("_"):
            continue  # transient, recomputed within a step
        if isinstance(value, torch.Generator):
            out[key] = {"generator_state": value.get_state()}
        elif isinstance(value, torch.Tensor):
            out[key] = value.detach().clone()
        else:
            out[key] = value
    return out


def _import_state(saved: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in saved.items():
        if isinstance(value, Mapping) and "generator_state" in value:
            generator = torch.Generator()
            generator.set_state(value["generator_state"])
            out[key] = generator
        elif isinstance(value, torch.Tensor):
            out[key] = value.clone()
        else:
            out[key] = value
    return out


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


def _check_model(model: object) -> DistributedDataParallel:
    if isinstance(model, DistributedDataParallel):
        return model
    raise TypeError(
        f"autocomp.wrap expects a DistributedDataParallel model, got {type(model).__name__}; "
        "wrap your module in DistributedDataParallel first: "
        "ddp = torch.nn.parallel.DistributedDataParallel(model); ctl = autocomp.wrap(ddp)"
    )


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
) -> Controller:
    """Register autocomp's comm hook on ``model`` (in place) and return its controller.

    Two modes:

    * **adaptive** (``wrap(ddp)`` or ``wrap(ddp, target_overlap=0.9)``): every ``window``
      steps the controller measures the link and the backward timeline, and the policy picks a
      compressor per layer so that communication hides behind backward compute
      (``target_overlap``) with the least compression error. ``plan`` rules become pins.
    * **static** (``wrap(ddp, plan=...)`` without ``target_overlap`` or ``policy``): the plan
      is applied as given and never changes.

    Args:
        model: a ``DistributedDataParallel`` model, before its first backward.
        plan: parameter-name globs mapped to compressor specs (first match wins, default
            ``none``), as a dict, a list of pairs, a :class:`~autocomp.plan.Plan`, or the path
            of a JSON plan file.
        target_overlap: fraction of gradient communication to hide behind backward compute,
            in [0, 1] (adaptive; default: the policy preset's, 0.9).
        policy: preset name (``default``, ``datacenter``, ``cloud-ethernet``, ``wan``,
            ``federated``) or path of a TOML policy (adaptive).
        window: steps between decisions (adaptive; default: the preset's replan_interval).
        warmup_steps: uncompressed steps at the start (adaptive: default the preset's;
            static: default 0). With Adam, a first step on a compressed gradient initializes
            the second-moment estimate from it; PyTorch's PowerSGD hook always runs its first
            2 steps uncompressed.
        seed: base seed of shared random choices (default ``AUTOCOMP_SEED`` or 0).
        run_dir: where rank 0 keeps the run log (adaptive): default
            ``./autocomp-runs/<run-id>`` (or ``AUTOCOMP_RUN_DIR``); ``False`` for none.
        dashboard: ``True`` or a port: rank 0 starts the sidecar (live ``/policy`` page, JSON
            API, metrics, overrides) as a separate process on 127.0.0.1 and prints its URL.

    All arguments must be equal on every rank; this is checked.

    Raises:
        TypeError: ``model`` is not DDP, or ``plan`` has the wrong type.
        ValueError: a spec, policy or numeric argument is invalid (the message says what is).
        RuntimeError: the model is already wrapped or has another comm hook, or the
            configuration differs between ranks (raised on every rank, before any training
            collective).
    """
    ddp = _check_model(model)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialized; call dist.init_process_group(...) (torchrun "
            "sets the environment) before creating DDP and calling autocomp.wrap"
        )
    if getattr(ddp, _WRAPPED_ATTR, None) is not None:
        raise RuntimeError(
            "this DDP model is already wrapped by autocomp; DDP allows one comm hook per model. "
            "Use the controller returned by the first wrap() call."
        )
    rules = load_plan(plan)
    adaptive = plan is None or target_overlap is not None or policy is not None
    if warmup_steps is not None:
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int):
            raise TypeError(f"warmup_steps must be an int, got {warmup_steps!r}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    loop_config: AdaptiveLoop.Config | None = None
    policy_rules: PolicyRules | None = None
    if adaptive:
        policy_rules = load_policy(policy if policy is not None else "default")
        if warmup_steps is not None:
            policy_rules = dataclasses.replace(policy_rules, warmup_steps=warmup_steps)
        target = policy_rules.target_overlap if target_overlap is None else target_overlap
        if isinstance(target, bool) or not isinstance(target, (int, float)):
            raise TypeError(f"target_overlap must be a number in [0, 1], got {target!r}")
        if window is None:
            window = policy_rules.replan_interval
        if isinstance(window, bool) or not isinstance(window, int):
            raise TypeError(f"window must be an int, got {window!r}")
        loop_config = AdaptiveLoop.Config(
            target_overlap=float(target), window=window, warmup_steps=policy_rules.warmup_steps
        )
        AdaptiveLoop.validate(loop_config)
    base_seed = AUTOCOMP_SEED.get() if seed is None else int(seed)
    group = ddp.process_group
    rank = dist.get_rank(group)
    world_size = dist.get_world_size(group)

    params = {n: p for n, p in ddp.module.named_parameters() if p.requires_grad}
    if not params:
        raise ValueError("the model has no parameters that require gradients; nothing to wrap")
    for pattern in rules.unmatched_patterns(params):
        message = f"autocomp plan: glob {pattern!r} matches no parameter of the model"
        warnings.warn(message, UserWarning, stacklevel=2)
        logger.warning(message)
    disabled = AUTOCOMP_DISABLE.get()
    if disabled:
        logger.warning("AUTOCOMP_DISABLE is set: every layer uses plain all-reduce")
    if adaptive or disabled:
        # Adaptive mode starts uncompressed (warm-up); the policy switches layers later.
        assignment: dict[str, Compressor] = {name: build_compressor("none") for name in params}
    else:
        assignment = rules.resolve(params)

    shapes: dict[str, object] = {n: p.shape for n, p in params.items()}
    # Everything else ranks must agree on rides along as pseudo-entries of the digest.
    settings = {
        "\0seed": (base_seed, world_size, warmup_steps),
        "\0rules": tuple((r.pattern, r.compressor.spec) for r in rules.rules),
        "\0adaptive": (repr(loop_config), repr(policy_rules), disabled),
    }
    digest = assignment_digest(
        {**assignment, **{key: build_compressor("none") for key in settings}},
        {**shapes, **settings},
    )
    require_same_on_all_ranks(digest, group, "the autocomp configuration (or the model)")

    slots = {
        name: LayerSlot(name=name, shape=p.shape, dtype=p.dtype, seed=layer_seed(base_seed, name))
        for name, p in params.items()
    }
    state = HookState(
        group,
        slots,
        {id(p): name for name, p in params.items()},
        rank=rank,
        world_size=world_size,
        check_wire_bytes=AUTOCOMP_CHECK_WIRE_BYTES.get(),
    )
    state.assign(assignment)
    if not adaptive and warmup_steps:
        for slot in slots.values():
            slot.uncompressed_until = warmup_steps
    try:
        ddp.register_comm_hook(state, autocomp_hook)
    except RuntimeError as err:
        raise RuntimeError(
            "could not register autocomp's comm hook: this DDP model already has a comm hook "
            f"(DDP allows only one). Remove the other register_comm_hook call. ({err})"
        ) from None
    loop = None
    runlog = None
    if loop_config is not None and policy_rules is not None and not disabled:
        pins = [(r.pattern, r.compressor.spec) for r in rules.rules]
        if rank == 0 and run_dir is not False:
            runlog = _open_run_log(run_dir, params, policy_rules, loop_config, world_size)
        loop = AdaptiveLoop(ddp, state, policy_rules, pins, loop_config, runlog=runlog)
    elif dashboard:
        raise ValueError("dashboard=... needs adaptive mode (it shows the per-window decisions)")
    controller = Controller(ddp, state, rules, params, loop)
    if dashboard and rank == 0 and runlog is not None:
        port = 8765 if dashboard is True else int(dashboard)
        controller._start_dashboard(runlog.path.parent, port)
    setattr(ddp, _WRAPPED_ATTR, controller)
    if rank == 0:
        compressed = sum(1 for c in assignment.values() if c.name != "none")
        logger.info(
            "autocomp: wrapped %d parameters across %d ranks, %s mode%s",
            len(assignment),
            world_size,
            controller.mode,
            f" (policy {policy_rules.name}, target overlap {loop_config.target_overlap}, "
            f"window {loop_config.window}, warm-up {loop_config.warmup_steps} steps)"
            if loop is not None and policy_rules is not None and loop_config is not None
            else f", {compressed} compressed",
        )
    return controller
