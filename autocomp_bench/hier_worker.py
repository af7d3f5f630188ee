"""One rank of ``autocomp-bench hier``: the shared budget loop, two HSDP methods, a digest.

:mod:`autocomp_bench.hier` starts nodes x ranks-per-node of these (``python -m
autocomp_bench.hier_worker CONFIG``; four by default), ranks-per-node in each network
namespace, with torchrun's environment. Each runs :func:`autocomp_bench.worker.worker_main`
unchanged, with two additions registered here before it starts (the shared worker knows only
DDP methods and 2 ranks):

* the methods ``hsdp`` (FSDP2 ``fully_shard`` on the 2-D (replicate, shard) mesh, FSDP's own
  HSDP) and ``hsdp-autocomp`` (``fully_shard`` on the shard sub-mesh, then
  ``autocomp.wrap_fsdp(model, mesh)``), on top of the shared ``attach`` (every other method
  goes to it unchanged);
* the loop ``hier-budget``: the shared wall-clock loop (:func:`~autocomp_bench.worker.
  train_budget`), then a digest of this rank's final parameters (the local shard for HSDP)
  so the benchmark can tell whether replicas ended bit-identical.

The mesh is ``(nodes, ranks per node)`` with rank ``r`` at ``(r // per_node, r % per_node)``:
shard groups are the ranks of one node (loopback), replicate groups join the ranks with the
same local index across nodes (the shaped link). Any shape works, one rank per node included
(shard groups of one: HSDP is then plain replication over the link).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

from autocomp_bench import worker

__all__ = ["HSDP_METHODS", "main", "parameter_digest", "shard_model"]

HSDP_METHODS: tuple[str, ...] = ("hsdp", "hsdp-autocomp", "hsdp-adaptive")
LOOP = "hier-budget"

_shared_attach = worker.attach
_built: dict[str, Any] = {}
"""The model of the run in progress (set by :func:`attach`, read by :func:`train_hier`)."""


def _mesh() -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    world = int(os.environ["WORLD_SIZE"])
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    if world % per_node:
        raise RuntimeError(f"WORLD_SIZE {world} is not a multiple of LOCAL_WORLD_SIZE {per_node}")
    return init_device_mesh(
        "cpu", (world // per_node, per_node), mesh_dim_names=("replicate", "shard")
    )


def shard_model(model: Any, mesh: Any) -> None:
    """``fully_shard`` every block of the model's ``nn.ModuleList`` s, then the root.

    The root holds everything else (a GPT's tied embedding is used by the root's forward at
    both ends, so it must stay in the root's unit); a model without blocks is one unit.
    """
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            for block in module:
                if any(True for _ in block.parameters()):
                    fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def attach(method: str, model: Any, cfg: dict[str, Any]) -> worker.Attached:
    """The shared ``attach`` plus the two HSDP methods; remembers the model for the digest."""
    _built["model"] = model
    if method not in HSDP_METHODS:
        return _shared_attach(method, model, cfg)
    import autocomp

    mesh = _mesh()
    numel = sum(p.numel() for p in model.parameters())
    shards = mesh.size(1)
    if method == "hsdp":
        shard_model(model, mesh)  # 2-D mesh: FSDP2's own HSDP
        # Each rank all-reduces its shard (about numel / shards floats) across the replicas.
        return worker.Attached(model, None, 4.0 * numel / shards)
    from autocomp.fsdp import FSDPController

    shard_model(model, mesh["shard"])
    # No start-up broadcast of replica 0's shards: like DDP's init_sync=False in the shared
    # attach, check_same_init has already verified that every rank built the same weights.
    config = FSDPController.Config(broadcast_parameters=False)
    if method == "hsdp-adaptive":
        target = float(cfg.get("target_overlap", 0.9))
        ctl = autocomp.wrap_fsdp(model, mesh, target_overlap=target, config=config)
    else:
        ctl = autocomp.wrap_fsdp(model, mesh, cfg.get("fsdp_plan"), config=config)
    return worker.Attached(model, ctl, None)


def parameter_digest(model: Any) -> str:
    """sha256 of this rank's parameters in order (the local shard of a DTensor), bit for bit.

    FSDP modules are resharded first: after a forward without backward (the last
    evaluation) FSDP2 may still hold the unsharded parameters.
    """
    import torch
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if isinstance(param, DTensor) else param
            digest.update(name.encode())
            digest.update(local.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def train_hier(cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    """:func:`~autocomp_bench.worker.train_budget`, then this rank's node, local index and
    parameter digest."""
    result = worker.train_budget(cfg, rank)
    model = _built.pop("model")
    result["node"] = int(os.environ.get("GROUP_RANK", "0"))
    result["local_rank"] = int(os.environ.get("LOCAL_RANK", "0"))
    result["parameter_digest"] = parameter_digest(model)
    result["digest_scope"] = "shard" if cfg["method"] in HSDP_METHODS else "full"
    return result


def install() -> None:
    """Register the HSDP methods and the ``hier-budget`` loop with the shared worker."""
    # worker._build looks ``attach`` up in its module at call time.
    worker.attach = attach
    worker.LOOPS[LOOP] = train_hier


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m autocomp_bench.hier_worker CONFIG.json", file=sys.stderr)
        return 2
    install()
    return worker.worker_main(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
