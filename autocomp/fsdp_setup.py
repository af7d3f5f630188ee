"""Checks and bookkeeping of :func:`autocomp.fsdp.wrap_fsdp`: the mesh, the sharded model,
each FSDP module's reduce-scatter layout, and the cross-rank agreement over a 2-D mesh.

Kept apart from the hook (:mod:`autocomp.fsdp`) because none of it runs during training.
Every check that may fail on one rank only ends in :func:`raise_on_mesh`, so the other ranks
raise too instead of waiting in the next collective.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from autocomp.compressors import Compressor, build_compressor
from autocomp.distributed import collective_device, gather_digests
from autocomp.hook_layer import LayerSlot

__all__ = [
    "DEFAULT_MATRIX_SPEC",
    "WRAPPED_ATTR",
    "GroupLayout",
    "broadcast_shards",
    "build_layouts",
    "check_mesh",
    "default_assignment",
    "fsdp_groups",
    "raise_on_mesh",
    "require_same_on_mesh",
]

DEFAULT_MATRIX_SPEC = "powersgd:rank=4"
"""What the default plan (``plan=None``) gives parameters of two or more dimensions; the rest
(biases, norms) are sent uncompressed."""

WRAPPED_ATTR = "_autocomp_fsdp_controller"
"""Attribute of a wrapped model holding its controller (wrapping twice is refused)."""


@dataclass(slots=True)
class GroupLayout:
    """Where each parameter's local shard lies in one FSDP module's reduce-scatter output."""

    module_name: str
    names: list[str | None]
    """Per FSDP parameter that receives a gradient; None for an empty local shard."""
    offsets: list[int]
    total: int
    """Elements of the flat reduce-scatter output (padded shards)."""
    dtype: torch.dtype
    """Dtype of the reduce-scatter output (the reduce dtype)."""
    slots: list[LayerSlot | None] = field(default_factory=list)
    """The slots of ``names``, once they exist."""


def raise_on_mesh(problem: Exception | None, groups: list[dist.ProcessGroup], what: str) -> None:
    """Collective over a 2-D mesh: raise on every rank if any rank has ``problem``.

    A flag all-reduced over the replicate group, then over the shard group, reaches every
    rank of the grid (the mesh need not be the whole world, so the default group will not do).
    """
    flag = torch.tensor([0 if problem is None else 1], dtype=torch.int64)
    flag = flag.to(collective_device(groups[0]))
    for group in groups:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if problem is not None:
        raise problem
    if int(flag.item()):
        raise RuntimeError(f"{what} failed on another rank; see that rank's error")


def require_same_on_mesh(digest: bytes, groups: list[dist.ProcessGroup], what: str) -> None:
    """RuntimeError on every rank of the mesh unless ``digest`` is equal on all of them
    (equal along every row and every column of the grid means equal everywhere)."""
    problem: Exception | None = None
    for group in groups:
        if len(set(gather_digests(digest, group))) != 1:
            problem = RuntimeError(
                f"{what} differs between ranks of the mesh. Every rank must build the same "
                "model, shard it the same way and pass the same plan and config; refusing to "
                "start rather than issue mismatched collectives."
            )
    raise_on_mesh(problem, groups, what)


def check_mesh(mesh: object) -> DeviceMesh:
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(
            f"wrap_fsdp expects a DeviceMesh, got {type(mesh).__name__}; build one with "
            'init_device_mesh(device, (replicas, shards), mesh_dim_names=("replicate", "shard"))'
        )
    if mesh.ndim != 2:
        raise ValueError(
            f"wrap_fsdp needs a 2-D (replicate, shard) mesh, got a {mesh.ndim}-D mesh of shape "
            f"{tuple(mesh.shape)}; dim 0 is the replicate dimension (the slow link), dim 1 the "
            "shard dimension"
        )
    if mesh.get_coordinate() is None:
        raise ValueError("this rank is not part of the mesh passed to wrap_fsdp")
    return mesh


def _effective_reduce_dtype(fsdp_param: Any) -> torch.dtype:
    """The dtype FSDP reduce-scatters this parameter's gradient in (its mixed precision)."""
    orig = fsdp_param.sharded_param.dtype
    policy = fsdp_param.mp_policy
    if not orig.is_floating_point:
        return orig
    return policy.reduce_dtype or policy.param_dtype or orig


def _param_groups(fsdp_state: Any) -> list[Any]:
    """An FSDP module's parameter groups, across torch versions: newer FSDP2 keeps a list
    (``_fsdp_param_groups``, several groups under per-parameter meshes), torch 2.11 and
    earlier one optional group (``_fsdp_param_group``; seen on a GPU machine, 2026-11-24)."""
    groups = getattr(fsdp_state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(fsdp_state, "_fsdp_param_group", None)
    return [] if group is None else [group]


def fsdp_groups(
    model: torch.nn.Module, shard_ranks: list[int]
) -> tuple[list[tuple[str, Any, Any]], Exception | None]:
    """``(module name, FSDP module, param group)`` of every FSDP module with parameters, or
    the first reason the model cannot be wrapped (rank-local: raised together later)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_common import (
        DDPMeshInfo,
        FSDPMeshInfo,
    )

    if not isinstance(model, FSDPModule):
        return [], TypeError(
            f"wrap_fsdp expects a model sharded with fully_shard, got {type(model).__name__}; "
            'shard it on the shard sub-mesh first: fully_shard(block, mesh=mesh["shard"]) for '
            'each block, then fully_shard(model, mesh=mesh["shard"])'
        )
    if getattr(model, WRAPPED_ATTR, None) is not None:
        return [], RuntimeError(
            "this model is already wrapped by autocomp.wrap_fsdp; use the controller returned "
            "by the first call"
        )
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        groups = _param_groups(module._get_fsdp_state())
        if not groups:
            continue
        where = name or "<root>"
        if len(groups) > 1:
            return [], ValueError(
                f"FSDP module {where!r} has {len(groups)} parameter groups (per-parameter "
                "meshes from shard_placement_fn); wrap_fsdp supports one mesh per module"
            )
        group = groups[0]
        info = group.mesh_info
        if isinstance(info, DDPMeshInfo):
            return [], ValueError(
                f"FSDP module {where!r} is sharded on a mesh with a replicate dimension "
                "(native HSDP), whose replica all-reduce FSDP2 runs before any hook can "
                "replace it. Shard on the shard sub-mesh instead: "
                'fully_shard(module, mesh=mesh["shard"]) (mesh[<name of dim 1>]), and '
                "pass the 2-D mesh to wrap_fsdp, which then averages across replicas."
            )
        if not isinstance(info, FSDPMeshInfo):
            return [], ValueError(f"FSDP module {where!r} is not sharded (mesh info {info!r})")
        ranks = dist.get_process_group_ranks(info.shard_process_group)
        if ranks != shard_ranks:
            return [], ValueError(
                f"FSDP module {where!r} shards over ranks {ranks}, but dim 1 of the mesh "
                f"given to wrap_fsdp groups this rank with {shard_ranks}; shard with "
                'fully_shard(module, mesh=mesh["shard"]) on the same mesh'
            )
        if getattr(group, "_all_reduce_hook", None) is not None:
            return [], RuntimeError(
                f"FSDP module {where!r} already has an all-reduce hook "
                "(set_all_reduce_hook); FSDP2 holds one per module"
            )
        for fsdp_param in group.fsdp_params:
            if fsdp_param.fsdp_placement.dim != 0:
                return [], ValueError(
                    f"parameter {fsdp_param._param_fqn!r} is sharded on dim "
                    f"{fsdp_param.fsdp_placement.dim}; wrap_fsdp supports Shard(0) only"
                )
        found.append((where, module, group))
    if not found:
        return [], ValueError("the model has no parameters sharded by fully_shard")
    return found, None


def build_layouts(
    found: list[tuple[str, Any, Any]],
    names: dict[int, str],
) -> tuple[list[GroupLayout], dict[str, tuple[torch.Size, torch.dtype]]]:
    """Each FSDP module's reduce-scatter layout, and every parameter's local shard."""
    layouts = []
    shards: dict[str, tuple[torch.Size, torch.dtype]] = {}
    for where, _module, group in found:
        entries: list[str | None] = []
        offsets, offset, dtypes = [], 0, set()
        for fsdp_param in group.fsdp_params:
            param = fsdp_param.sharded_param
            if not param.requires_grad:
                continue  # never in the reduce-scatter (FSDP skips parameters without grads)
            name = names[id(param)]
            # FSDP pads dim 0 to a multiple of the shard count; every shard is that long.
            padded = torch.Size(fsdp_param.padded_sharded_param_size).numel()
            dtype = _effective_reduce_dtype(fsdp_param)
            dtypes.add(dtype)
            local = torch.Size(fsdp_param.sharded_size)
            shards[name] = (local, dtype)
            entries.append(name if local.numel() else None)
            offsets.append(offset)
            offset += padded
        if len(dtypes) > 1:
            raise ValueError(f"FSDP module {where!r} reduces gradients in several dtypes")
        if entries:
            layouts.append(
                GroupLayout(where, entries, offsets, offset, dtypes.pop())  # type: ignore[arg-type]
            )
    return layouts, shards


def broadcast_shards(params: dict[str, DTensor], group: dist.ProcessGroup) -> None:
    """Replica 0's local shards to every replica: one broadcast per dtype."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for name in sorted(params):
        local = params[name].to_local()
        if local.numel():
            by_dtype.setdefault(local.dtype, []).append(local)
    with torch.no_grad():
        for dtype in sorted(by_dtype, key=str):
            locals_ = by_dtype[dtype]
            flat = torch.cat([t.reshape(-1) for t in locals_])
            dist.broadcast(flat, group=group, group_src=0)
            start = 0
            for t in locals_:
                t.copy_(flat[start : start + t.numel()].view_as(t))
                start += t.numel()


def default_assignment(params: Mapping[str, torch.nn.Parameter]) -> dict[str, Compressor]:
    matrix, plain = build_compressor(DEFAULT_MATRIX_SPEC), build_compressor("none")
    return {name: matrix if p.ndim >= 2 else plain for name, p in params.items()}
