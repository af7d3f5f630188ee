"""Tier 2: per-step quality of every compressor, on 2 local gloo ranks.

Two kinds of checks:

- **Exact references.** autocomp's PowerSGD and fp16 run side by side with PyTorch's own
  ``powerSGD_hook`` and ``fp16_compress_hook`` on the very same buckets, step after step (both
  hooks see identical gradients; PyTorch's output drives the optimizer). PowerSGD starts from
  PyTorch's warm-start Q with zero residuals, after which the two must deliver the same
  averaged gradient up to floating-point order (relative difference under 1e-3 after 20
  steps, measured ~1e-6 at first and ~1e-4 after 40 steps as rounding differences grow
  through training). fp16 must agree to fp16 rounding.
- **Learning per step against plain DDP** (``autocomp_bench.quality`` on the digits MLP, SGD
  with momentum, 400 steps, mean of seeds 0 and 1, every tensor on the compressor after 2
  uncompressed steps). Stated tolerance: within 2 points of DDP's validation accuracy (DDP
  itself varies by 1.4 points between seeds; measured gaps on 2026-11-23 were within
  0.5 points). randomk is the exception and has its own bound: with error feedback at
  ratio 0.25 it reached 87.9% against DDP's 97.6% (each coordinate is sent about every
  1/ratio steps, so error feedback delivers it as a stale burst; unbiased randomk at ratio 0.1
  diverges at this learning rate), which is why no policy preset offers it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from autocomp.hook import autocomp_hook
from autocomp_bench.quality import QualityRun, run_quality, summarize
from autocomp_bench.tasks import build_task
from tests.multirank import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

SIDE_BY_SIDE_STEPS = 20


def _torch_q_layout(bucket: dist.GradBucket, names: dict[int, str], rank: int) -> list[tuple]:
    """(name, cols) per tensor PyTorch's hook compresses, in its Q memory order: tensors
    grouped by matrix shape, shapes in first-seen order (``batch_tensors_with_same_shape``
    off)."""
    groups: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for param in bucket.parameters():
        rows = param.shape[0] if param.dim() else 1
        cols = param.numel() // rows if rows else 0
        r = min(rows, cols, rank)
        if torch_powersgd._should_compress(rows, cols, r, 2)[0]:
            groups.setdefault((rows, cols), []).append((names[id(param)], cols))
    return [item for items in groups.values() for item in items]


def _side_by_side(rank: int, world: int, reference: str, spec: str) -> list[float]:
    """Relative difference per step between PyTorch's hook and autocomp on the same buckets."""
    task = build_task("gpt-small")
    torch.manual_seed(0)
    model = task.build_model()
    ddp = DDP(model, bucket_cap_mb=10_000)
    torch.manual_seed(0)
    shadow = DDP(task.build_model(), bucket_cap_mb=10_000)  # only to build autocomp's state
    ours = autocomp.wrap(shadow, plan={"*": spec})._state
    ours.param_names = {id(p): n for n, p in model.named_parameters()}
    power_rank = 4
    if reference == "powersgd":
        theirs: Any = torch_powersgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=power_rank,
            start_powerSGD_iter=2,
            use_error_feedback=True,
            warm_start=True,
        )
        their_hook = torch_powersgd.powerSGD_hook
        start = 3  # PyTorch compresses from step 2; autocomp takes its Q after that step
        for slot in ours.slots.values():
            slot.uncompressed_until = start
    else:
        theirs, their_hook = None, default_hooks.fp16_compress_hook
        start = 0
    step_now = [0]
    differences: list[float] = []

    def both(_, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
        buffer = bucket.buffer()
        grads = buffer.clone()
        expected = their_hook(theirs, bucket).wait().clone()
        if reference == "powersgd" and step_now[0] == start - 1:
            # Same warm start and no residual on both sides from the next step on.
            q = theirs.q_memory_dict[bucket.index()]
            offset = 0
            for name, cols in _torch_q_layout(bucket, ours.param_names, power_rank):
                size = cols * power_rank
                ours.slots[name].state["q"] = q[offset : offset + size].view(cols, -1).clone()
                offset += size
            assert offset == q.numel()
            theirs.error_dict[bucket.index()].zero_()
        buffer.copy_(grads)
        got = autocomp_hook(ours, bucket).wait()
        got = got[0] if isinstance(got, list) else got
        if step_now[0] >= start:
            differences.append(float((got - expected).norm() / expected.norm()))
        buffer.copy_(expected)
        fut = torch.futures.Future()
        fut.set_result(buffer)
        return fut

    ddp.register_comm_hook(None, both)
    optimizer = task.make_optimizer(ddp.parameters())
    for step in range(SIDE_BY_SIDE_STEPS + start):
        step_now[0] = step
        x, y = task.batch(rank, step, 0)
        loss = task.loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return differences


def test_powersgd_delivers_what_pytorchs_hook_delivers(tmp_path: Path) -> None:
    """Same Q, same gradients: the averaged gradients agree to rounding, every step."""
    results = run_ranks(_side_by_side, 2, tmp_path, "powersgd", "powersgd:rank=4")
    differences = results[0]
    assert len(differences) == SIDE_BY_SIDE_STEPS
    assert differences[0] < 1e-5, differences
    assert max(differences) < 1e-3, differences


def test_fp16_delivers_what_pytorchs_fp16_hook_delivers(tmp_path: Path) -> None:
    results = run_ranks(_side_by_side, 2, tmp_path, "fp16", "fp16:ef=false")
    assert max(results[0]) < 1e-3, results[0]


DIGITS_STEPS = 400
TOLERANCE_POINTS = 0.02
"""Within 2 points of DDP's accuracy (mean of 2 seeds); see the module docstring."""
RANDOMK_FLOOR = 0.8
"""randomk's own bound (measured 87.9%); see the module docstring."""


@pytest.fixture(scope="module")
def digits_quality() -> dict[str, float]:
    methods = (
        "ddp",
        "autocomp:fp16",
        "autocomp:bf16",
        "autocomp:int8",
        "autocomp:qsgd",
        "autocomp:sign",
        "autocomp:topk:ratio=0.01",
        "autocomp:powersgd:rank=4",
        "autocomp:randomk:ratio=0.25,unbiased=false",
    )
    run = QualityRun(
        task="digits-mlp", methods=methods, seeds=(0, 1), steps=DIGITS_STEPS, eval_every=100
    )
    rows = summarize(run_quality(run), "valid_accuracy")
    return {row["method"]: row["mean"] for row in rows}


@pytest.mark.parametrize(
    "spec", ["fp16", "bf16", "int8", "qsgd", "sign", "topk:ratio=0.01", "powersgd:rank=4"]
)
def test_compressor_learns_like_plain_ddp(digits_quality: dict[str, float], spec: str) -> None:
    assert digits_quality[f"autocomp:{spec}"] >= digits_quality["ddp"] - TOLERANCE_POINTS


def test_randomk_learns_within_its_documented_bound(digits_quality: dict[str, float]) -> None:
    assert digits_quality["autocomp:randomk:ratio=0.25,unbiased=false"] >= RANDOMK_FLOOR
