"""Tier 4 (GPU): the hierarchical DDP hook and ``wrap_fsdp`` with CUDA tensors.

NCCL needs one GPU per rank, so with one GPU the multi-rank paths run as 4 gloo ranks sharing
``cuda:0`` (gloo moves CUDA tensors through the host), and NCCL's own semantics (streams, CUDA
futures) are checked with a world of one:

- the hierarchical hook, two "nodes" of two ranks, every compressor across nodes: the 4 ranks
  end bit-identical and the loss falls, as ``tests/test_hierarchy.py`` checks on CPU;
- ``wrap_fsdp`` on a 2x2 (replicate, shard) mesh of CUDA shards: every replica of a shard stays
  bit-identical, the loss falls, and the bytes across the replicate dimension are what the
  compressors report, as ``tests/test_fsdp.py`` checks on CPU;
- ``hierarchy="auto"`` on CUDA gradients: the level probe's figures agree on every rank and
  decide two-level or flat by the threshold, as on CPU;
- a NaN in one rank's gradient: every rank flags the layer's average at the next step and
  sends it uncompressed once (the flags reach the host through pinned copies and events);
- ``wrap_fsdp`` under NCCL on a (1, 1) mesh in adaptive mode: FSDP2's hooks run on its CUDA
  streams, the window loop decides, and the loss falls.

Skipped without CUDA (see ``tests/gpu/cuda.py``).
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from autocomp.compressors import build_compressor
from tests.gpu.cuda import GPU_MARKS, requires_nccl
from tests.models import MultiBucketNet, classification_batch
from tests.multirank import run_ranks
from tests.test_fsdp import MIXED_PLAN as FSDP_PLAN
from tests.test_fsdp import _net, _shard, _train
from tests.test_hierarchy import MIXED_PLAN, _auto_measured, check_auto_measured

pytestmark = [*GPU_MARKS, pytest.mark.multirank, pytest.mark.timeout(400)]

STEPS = 20
HIER_STEPS = 30
"""As ``tests/test_hierarchy.py``: this net's loss falls by 10% in 30 steps, not in 20."""


def _hierarchical(rank: int, world_size: int) -> dict[str, Any]:
    """Two nodes of two ranks (torchrun's variables), all on ``cuda:0``."""
    os.environ["GROUP_RANK"] = str(rank // 2)
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    os.environ["LOCAL_RANK"] = str(rank % 2)
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = MultiBucketNet().cuda()
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=0.02)
    ctl = autocomp.wrap(ddp, plan=MIXED_PLAN, hierarchy=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(HIER_STEPS):
        x, y = classification_batch(rank, step)
        loss = torch.nn.functional.cross_entropy(ddp(x.cuda()), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state = ctl._state
    return {
        "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu(),
        "losses": losses,
        "hierarchical": state.hierarchy is not None,
        "buckets": len(state._layouts),
        "residual_devices": sorted(
            {str(s.residual.device) for s in state.slots.values() if s.residual is not None}
        ),
    }


def test_hierarchy_on_cuda_keeps_ranks_identical(tmp_path: Path) -> None:
    results = run_ranks(_hierarchical, 4, tmp_path, timeout=360)
    reference = results[0]
    assert reference["hierarchical"] and reference["buckets"] >= 3
    for rank, result in enumerate(results[1:], start=1):
        assert torch.equal(reference["params"], result["params"]), f"rank {rank} differs"
    assert torch.isfinite(reference["params"]).all()
    losses = reference["losses"]
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:3]) / 3, losses
    assert reference["residual_devices"] == ["cuda:0"], reference["residual_devices"]


def test_auto_hierarchy_times_both_links_on_cuda(tmp_path: Path) -> None:
    """``hierarchy="auto"`` with the gradients on ``cuda:0``: the adaptive opening probes the
    CUDA buffers, the level probe times the gloo groups, and both thresholds decide alike on
    every rank."""
    check_auto_measured(run_ranks(_auto_measured, 4, tmp_path, "cuda", timeout=300))


POISON_STEP = 3


def _nan_on_cuda(rank: int, world_size: int) -> dict[str, Any]:
    """Static plan on ``cuda:0``; rank 0's ``fc1.weight`` gradient holds a NaN at one step."""
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = MultiBucketNet().cuda()
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=0.02)
    ctl = autocomp.wrap(ddp, plan={"fc1.weight": "powersgd:rank=4", "*": "fp16"})
    current = {"step": 0}

    def poison(grad: torch.Tensor) -> torch.Tensor:
        if rank == 0 and current["step"] == POISON_STEP:
            grad = grad.clone()
            grad[0, 0] = float("nan")
        return grad

    model.fc1.weight.register_hook(poison)
    slot = ctl._state.slots["fc1.weight"]
    sent = []
    for step in range(POISON_STEP + 3):
        current["step"] = step
        before = slot.bytes_sent
        x, y = classification_batch(rank, step)
        ddp.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x.cuda()), y.cuda()).backward()
        sent.append(slot.bytes_sent - before)
    return {
        "events": list(ctl._state.nonfinite_events),
        "sent": sent,
        "raw": slot.numel * 4,
    }


def test_nonfinite_average_on_cuda_is_seen_by_every_rank(tmp_path: Path) -> None:
    # On CUDA the flags reach the host through pinned copies and events queued at the decode
    # (HookState.add_checks); the reaction must still come at the next step, on every rank.
    results = run_ranks(_nan_on_cuda, 2, tmp_path, timeout=240)
    for result in results:
        assert result["events"] == [(POISON_STEP, "fc1.weight")], result
        sent = result["sent"]
        assert sent[POISON_STEP] < result["raw"], sent
        assert sent[POISON_STEP + 1] == result["raw"], sent  # uncompressed once, EF reset
        assert sent[POISON_STEP + 2] < result["raw"], sent
    assert results[0]["sent"] == results[1]["sent"]


def _fsdp_on_cuda(rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    torch.cuda.set_device(0)
    mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = _shard(_net().cuda(), mesh["shard"])
    ctl = autocomp.wrap_fsdp(model, mesh, plan=FSDP_PLAN)
    per_step_wire = sum(
        build_compressor(ctl.plan[n]).wire_bytes(s.shape, s.dtype)
        for n, s in ctl._state.slots.items()
    )
    losses = _train(model, rank, STEPS, lr=0.05, device="cuda")
    flat = torch.cat([p.detach().to_local().reshape(-1) for p in model.parameters()])
    replicate = mesh.get_group(0)
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size(replicate))]
    dist.all_gather(gathered, flat, group=replicate)
    return {
        "losses": losses,
        "identical": all(torch.equal(g, flat) for g in gathered),
        "device": str(flat.device),
        "sent": ctl.bytes_sent,
        "expected_sent": STEPS * per_step_wire,
        "raw": ctl.bytes_raw,
    }


def test_fsdp_on_cuda_keeps_replicas_identical(tmp_path: Path) -> None:
    results = run_ranks(_fsdp_on_cuda, 4, tmp_path, timeout=360)
    for rank, r in enumerate(results):
        assert r["identical"], rank
        assert r["device"].startswith("cuda"), r["device"]
        first, last = sum(r["losses"][:5]) / 5, sum(r["losses"][-5:]) / 5
        assert last < 0.5 * first, r["losses"]
        assert r["sent"] == r["expected_sent"] and r["sent"] < r["raw"], r


@requires_nccl
def test_wrap_fsdp_adaptive_under_nccl(tmp_path: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group(
        "nccl",
        store=store,
        rank=0,
        world_size=1,
        device_id=device,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        mesh = init_device_mesh("cuda", (1, 1), mesh_dim_names=("replicate", "shard"))
        model = _shard(_net().cuda(), mesh["shard"])
        ctl = autocomp.wrap_fsdp(model, mesh, target_overlap=0.9, window=4)
        losses = _train(model, 0, STEPS, lr=0.05, device="cuda")
        stats = ctl.stats()
        history = list(ctl.history)
        ctl.close()
    finally:
        dist.destroy_process_group()
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.5 * first, losses
    assert stats["step"] == STEPS, stats
    assert history, "the adaptive window loop never closed a window"
