"""The controller's checkpoint format: one structure for ``torch.save`` and for DCP.

``Controller.state_dict()`` has the same keys from ``wrap`` on, with every tensor allocated
(a residual that does not exist yet is a zero tensor with a 0 in ``has_residual``), so a fresh
controller's state dict is a valid load template for ``torch.distributed.checkpoint``, and the
controller itself is a DCP ``Stateful``::

    dcp.save({"model": ..., "autocomp": ctl}, checkpoint_id=path)
    dcp.load({"model": ..., "autocomp": ctl}, checkpoint_id=path)

Layout (version 3)::

    version, mode, world_size, step     shared by every rank
    plan                                JSON of every layer's spec (shared)
    loop                                window-loop counters (shared, adaptive)
    rank{r}/rank, rank{r}/world_size    whose entry this is
    rank{r}/planner                     decision state (adaptive; rank 0's is the one in use)
    rank{r}/residual/<layer>            error-feedback residual, float32, the layer's shape
    rank{r}/has_residual                uint8 per layer (0: the residual is not in use)
    rank{r}/compressor_state            warm starts, generators, counters (opaque bytes)

Rank-specific entries are namespaced by rank: DCP saves identical keys once, so without the
namespace rank 0 would have loaded rank 1's residuals. An entry whose ``rank`` or
``world_size`` is not this process's is refused. **Resuming at a different world size**
carries the plan, the step and each surviving rank's decision state (rank 0's link fit, cost
model, measured errors and guards are the ones that decide) over, and starts residuals and
warm starts afresh: residuals are per rank and
scaled by 1/world size, and there is no rank to give another rank's memory to (a one-time
loss of at most one step's compression error per layer). With DCP, load such a checkpoint
with :class:`autocomp.ElasticLoadPlanner`: ranks that did not exist before have no entry,
and it leaves out just those (``allow_partial_load`` would stop checking the model's keys).

``FSDPController.state_dict()`` (:func:`autocomp.wrap_fsdp`) has the same version and
shared keys plus ``mesh_shape``; everything else sits in the global rank's entry, ``plan``
and ``loop`` included, because each replicate group decides the plan of its own shards::

    rank{g}/rank, rank{g}/world_size    the global rank and world size
    rank{g}/plan                        JSON of this rank's parameters' specs
    rank{g}/loop, rank{g}/planner       window loop and decision state (adaptive)
    rank{g}/residual/<param>            error-feedback residual of this rank's local shard
    rank{g}/has_residual, rank{g}/compressor_state

A residual is a slice of one shard of one replica, so an FSDP checkpoint resumes its
residuals, warm starts and decision state only on the same mesh shape and world size. On
another mesh only the step carries over, with a warning; the rest starts afresh
(:func:`_resume_on_another_mesh`). With DCP, load it with
:class:`autocomp.ElasticLoadPlanner`, which leaves out the rank entries that are missing or
shaped for the old mesh.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from autocomp.compressors import build_compressor, effective_compressor

if TYPE_CHECKING:
    from autocomp.controller import Controller
    from autocomp.fsdp import FSDPController
    from autocomp.hook_state import HookState

logger = logging.getLogger(__name__)

__all__ = ["VERSION", "export_fsdp_state", "export_state", "import_fsdp_state", "import_state"]

VERSION = 3


def _pack(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _unpack(blob: Any) -> Any:
    if isinstance(blob, io.BytesIO):
        blob = blob.getvalue()
    if not isinstance(blob, (bytes, bytearray)):
        raise ValueError("autocomp state dict: expected packed bytes")
    return torch.load(io.BytesIO(bytes(blob)), weights_only=False)


def _export_compressor_state(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith("_"):
            continue  # transient, recomputed within a step
        if isinstance(value, torch.Generator):
            out[key] = {"generator_state": value.get_state(), "device": str(value.device)}
        elif isinstance(value, torch.Tensor):
            out[key] = value.detach().cpu().clone()
        else:
            out[key] = value
    return out


def _import_compressor_state(saved: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in saved.items():
        if isinstance(value, Mapping) and "generator_state" in value:
            generator = torch.Generator(device=value.get("device", "cpu"))
            generator.set_state(value["generator_state"])
            out[key] = generator
        elif isinstance(value, torch.Tensor):
            out[key] = value.to(device).clone()
        else:
            out[key] = value
    return out


def _slots_entry(state: HookState, device_of: Callable[[str], torch.device]) -> dict[str, Any]:
    """This rank's residuals (zeros where none is in use), their flags and compressor state."""
    residuals: dict[str, torch.Tensor] = {}
    present = []
    private = {}
    for name, slot in state.slots.items():
        if slot.residual is None:
            residuals[name] = torch.zeros(slot.shape, dtype=torch.float32, device=device_of(name))
            present.append(0)
        else:
            residuals[name] = slot.residual.detach().clone()
            present.append(1)
        private[name] = _export_compressor_state(slot.state)
    return {
        "residual": residuals,
        "has_residual": torch.tensor(present, dtype=torch.uint8),
        "compressor_state": _pack(private),
    }


def _restore_slots(
    state: HookState,
    entry: Mapping[str, Any] | None,
    device_of: Callable[[str], torch.device],
    seed_rank: int,
) -> None:
    """Every slot's compressor state afresh, then ``entry``'s (None: nothing carried over)."""
    private = _unpack(entry["compressor_state"]) if entry is not None else {}
    present = entry["has_residual"].tolist() if entry is not None else []
    for index, (name, slot) in enumerate(state.slots.items()):
        slot.state = slot.compressor.init_state(slot.shape, slot.seed, seed_rank)
        slot.residual = None
        if entry is None:
            continue
        device = device_of(name)
        slot.state.update(_import_compressor_state(private.get(name, {}), device))
        if present[index]:
            slot.residual = entry["residual"][name].detach().to(device).clone()


def _saved_plan(state: HookState, text: str) -> dict[str, str]:
    """The saved plan, refused unless it names exactly this model's parameters."""
    plan = json.loads(text)
    names = set(state.slots)
    if set(plan) != names:
        missing = sorted(names - set(plan))[:5]
        extra = sorted(set(plan) - names)[:5]
        raise ValueError(
            f"state dict does not match this model: missing {missing}, unexpected {extra}"
        )
    return plan


def _no_entry(saved: Mapping[str, Any], rank: int) -> ValueError:
    others = sorted(k for k in saved if k.startswith("rank"))
    return ValueError(
        f"this state dict holds {', '.join(others) or 'no rank entry'}, not rank{rank}: "
        "error-feedback residuals belong to one rank; load each rank's own entry"
    )


def _check_entry(entry: Mapping[str, Any], rank: int, world: int) -> None:
    """Refuse a rank entry saved by another rank or another job size."""
    for key, mine in (("rank", rank), ("world_size", world)):
        if int(entry[key]) != mine:
            raise ValueError(
                f"the rank entry of this state dict was saved with {key}={entry[key]}, this "
                f"process has {key}={mine}: error-feedback residuals belong to one rank of "
                "one job; load each rank's own entry"
            )


def _check_specs(state: HookState, plan: Mapping[str, str]) -> None:
    """Refuse a plan this job's compressors do not run (static plans are not replaced).

    Specs compare as the hook runs them (``effective_compressor``): a checkpoint saved before
    PowerSGD's 1-D tensors ran as 'none' names PowerSGD for them, and resumes."""
    for name, spec in plan.items():
        slot = state.slots[name]
        canonical = effective_compressor(build_compressor(spec), slot.shape).spec
        if canonical != slot.compressor.spec:
            raise ValueError(
                f"{name}: state dict was saved with compressor {canonical}, this job uses "
                f"{state.slots[name].compressor.spec}; wrap with the same plan to resume"
            )


def export_state(controller: Controller) -> dict[str, Any]:
    """The controller's state dict (see the module docstring)."""
    state = controller._state
    rank, world = state.rank, state.world_size
    out: dict[str, Any] = {
        "version": VERSION,
        "mode": controller.mode,
        "world_size": world,
        "step": state.step,
        "plan": json.dumps({name: slot.compressor.spec for name, slot in state.slots.items()}),
        f"rank{rank}": {
            "rank": rank,
            "world_size": world,
            **_slots_entry(state, lambda name: controller._params[name].device),
        },
    }
    loop = controller.adaptive
    if loop is not None:
        out["loop"] = json.dumps(loop.loop_state_dict())
        out[f"rank{rank}"]["planner"] = _pack(loop.planner.state_dict())
    return out


def import_state(controller: Controller, saved: Mapping[str, Any]) -> None:
    """Restore :func:`export_state` output; ValueError when it belongs to another job."""
    state = controller._state
    rank, world = state.rank, state.world_size
    if not isinstance(saved, Mapping) or "plan" not in saved:
        raise ValueError("not an autocomp state dict (missing 'plan')")
    version = saved.get("version")
    if version != VERSION:
        raise ValueError(
            f"autocomp state dict version {version!r}; expected {VERSION} (older versions held "
            "per-rank residuals under shared keys)"
        )
    if saved.get("mode") != controller.mode:
        raise ValueError(
            f"state dict is from a {saved.get('mode')} controller, this one is {controller.mode}"
        )
    plan = _saved_plan(state, saved["plan"])
    saved_world = int(saved["world_size"])
    entry = saved.get(f"rank{rank}")
    if entry is None and saved_world == world:
        raise _no_entry(saved, rank)
    if entry is not None and saved_world == world:
        _check_entry(entry, rank, world)
    loop = controller.adaptive
    if loop is not None:
        # The plan is part of the adaptive state: switch to the saved one first.
        state.assign({name: build_compressor(spec) for name, spec in plan.items()})
        if "loop" in saved:
            loop.load_loop_state_dict(json.loads(saved["loop"]))
        if entry is not None and "planner" in entry:
            loop.planner.load_state_dict(_unpack(entry["planner"]))
    _check_specs(state, plan)
    same_world = saved_world == world and entry is not None
    if not same_world:
        logger.warning(
            "autocomp: resuming a %d-rank checkpoint on %d ranks: plan, step and decision "
            "state carried over; error-feedback residuals and warm starts start afresh",
            saved_world,
            world,
        )
    _restore_slots(
        state,
        entry if same_world else None,
        lambda name: controller._params[name].device,
        rank,
    )
    state.step = int(saved["step"])


def export_fsdp_state(controller: FSDPController) -> dict[str, Any]:
    """The FSDP controller's state dict (see the module docstring)."""
    import torch.distributed as dist

    state = controller._state
    rank, world = dist.get_rank(), dist.get_world_size()
    params = dict(controller._model.named_parameters())
    entry: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "plan": json.dumps({name: slot.compressor.spec for name, slot in state.slots.items()}),
        **_slots_entry(state, lambda name: params[name].device),
    }
    loop = controller.adaptive
    if loop is not None:
        entry["loop"] = json.dumps(loop.loop_state_dict())
        entry["planner"] = _pack(loop.planner.state_dict())
    return {
        "version": VERSION,
        "mode": f"fsdp-{controller.mode}",
        "world_size": world,
        "mesh_shape": json.dumps(list(controller.mesh_shape)),
        "step": state.step,
        f"rank{rank}": entry,
    }


def import_fsdp_state(controller: FSDPController, saved: Mapping[str, Any]) -> None:
    """Restore :func:`export_fsdp_state` output; ValueError when it belongs to another job or
    another rank. A checkpoint of another mesh resumes its step alone."""
    import torch.distributed as dist

    state = controller._state
    rank, world = dist.get_rank(), dist.get_world_size()
    mode = f"fsdp-{controller.mode}"
    if not isinstance(saved, Mapping) or "mesh_shape" not in saved:
        raise ValueError("not an autocomp FSDP state dict (missing 'mesh_shape')")
    if saved.get("version") != VERSION:
        version = saved.get("version")
        raise ValueError(f"autocomp state dict version {version!r}; expected {VERSION}")
    if saved.get("mode") != mode:
        raise ValueError(f"state dict is from a {saved.get('mode')} controller, this one is {mode}")
    mesh = tuple(json.loads(saved["mesh_shape"]))
    if mesh != tuple(controller.mesh_shape) or int(saved["world_size"]) != world:
        _resume_on_another_mesh(controller, saved, mesh)
        return
    entry = saved.get(f"rank{rank}")
    if entry is None:
        raise _no_entry(saved, rank)
    _check_entry(entry, rank, world)
    plan = _saved_plan(state, entry["plan"])
    loop = controller.adaptive
    if loop is not None:
        state.assign({name: build_compressor(spec) for name, spec in plan.items()})
        loop.load_loop_state_dict(json.loads(entry["loop"]))
        loop.planner.load_state_dict(_unpack(entry["planner"]))
    _check_specs(state, plan)
    params = dict(controller._model.named_parameters())
    _restore_slots(state, entry, lambda name: params[name].device, state.rank)
    state.step = int(saved["step"])


def _resume_on_another_mesh(
    controller: FSDPController, saved: Mapping[str, Any], mesh: tuple[int, ...]
) -> None:
    """Resume an FSDP checkpoint of another mesh shape or world size: the step only.

    A residual is a slice of one shard of one replica, and the new shards cut the parameters
    elsewhere and pair other replicas, so error feedback and warm starts start afresh (a
    one-time loss of at most one step's compression error per parameter, as after a switch
    of compressor). The plan, the window counters and the decision state are per replicate
    group and per shard shape, so they are not carried over either (a freshly wrapped
    controller's stay): in adaptive mode the first window after the resume decides, since the
    step is past the warm-up. Every rank takes this path
    alike (it depends only on the shared keys), and no rank's own entry is read, so ranks
    that did not exist before need none. The saved plan, where this rank's entry holds one,
    must still name this model's parameters.
    """
    import torch.distributed as dist

    state = controller._state
    rank, world = dist.get_rank(), dist.get_world_size()
    entry = saved.get(f"rank{rank}")
    if isinstance(entry, Mapping) and "plan" in entry:
        # Names only: a static plan resolves per shard (an empty or 1-row shard sends plain),
        # so the saved specs may differ from this mesh's.
        _saved_plan(state, entry["plan"])
    params = dict(controller._model.named_parameters())
    _restore_slots(state, None, lambda name: params[name].device, state.rank)
    state.step = int(saved["step"])
    if rank == 0:
        logger.warning(
            "autocomp: resuming an FSDP checkpoint of a %s mesh (%s ranks) on a %s mesh (%d "
            "ranks) at step %d: only the step carries over; the plan, its decision state, "
            "error-feedback residuals and warm starts do not (they belong to one shard of one "
            "replica)",
            "x".join(map(str, mesh)),
            saved["world_size"],
            "x".join(map(str, controller.mesh_shape)),
            world,
            state.step,
        )
