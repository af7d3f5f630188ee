"""Tier 4 (GPU): the comm hook with CUDA gradients, 2 gloo ranks sharing one GPU.

Both ranks put their model on ``cuda:0`` and talk over gloo (which moves CUDA tensors through
the host), so one GPU is enough. ``autocomp.wrap`` in static mode (every compressor in one
model, PowerSGD pipelined across several buckets) and in adaptive mode (CUDA-event profiling,
rank 0 calibrating on the GPU, a fixed slow link injected on rank 0 so that the policy
compresses, as in ``tests/test_adaptive.py``): the ranks end bit-identical and hold the same
plan at every step, and the loss falls.

Skipped without CUDA (see ``tests/gpu/cuda.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
import autocomp.hook
from autocomp.link_model import LinkEstimate
from tests.gpu.cuda import GPU_MARKS
from tests.models import EVERY_COMPRESSOR_PLAN, MultiBucketNet, classification_batch
from tests.multirank import run_ranks

pytestmark = [*GPU_MARKS, pytest.mark.multirank, pytest.mark.timeout(400)]

WINDOW = 4
POLICY = """
version = 1
[policy]
description = "gpu test: small tensors allowed"
warmup_steps = 4
min_numel = 64
compress_1d = false
fast_link_gbit = 25.0
candidates = ["none", "fp16", "int8", "topk:ratio=0.1", "powersgd:rank=2"]
[guards]
loss_spike_ratio = 1.5
loss_window = 8
accordion_threshold = 0.5
accordion_interval_steps = 8
residual_factor = 32.0
backoff_recovery_steps = 400
max_backoff_levels = 3
"""
SLOW_LINK = LinkEstimate(
    latency_s=1e-3, bandwidth_bytes_per_s=10e6 / 8, samples=16, rel_residual=0.0
)
STEPS = 6 * WINDOW


def train(rank: int, world_size: int, device_name: str, mode: str, policy: str) -> dict[str, Any]:
    """Train MultiBucketNet on ``device_name`` (every rank the same device) with the hook."""
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = MultiBucketNet().to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(model, device_ids=device_ids, bucket_cap_mb=0.02)
    if mode == "static":
        ctl = autocomp.wrap(ddp, plan=EVERY_COMPRESSOR_PLAN)
    else:
        ctl = autocomp.wrap(ddp, target_overlap=0.9, policy=policy, window=WINDOW)
        assert ctl.adaptive is not None
        if rank == 0:
            ctl.adaptive.meter.end_window = lambda **_: SLOW_LINK  # type: ignore[method-assign]
            ctl.adaptive.payoff.hold_reason = lambda *_: None  # type: ignore[method-assign]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses, plans = [], {}
    for step in range(STEPS):
        x, y = classification_batch(rank, step)
        loss = torch.nn.functional.cross_entropy(ddp(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctl.observe_loss(loss)
        losses.append(loss.item())
        plans[ctl.step] = dict(ctl.plan)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    clock = None if ctl.adaptive is None else type(ctl.adaptive.profiler.clock).__name__
    return {
        "params": params,
        "losses": losses,
        "plans": plans,
        "stats": ctl.stats(),
        "buckets": len(ctl._state._layouts),
        "grad_device": str(next(model.parameters()).grad.device),  # type: ignore[union-attr]
        "clock": clock,
        "history": [record.to_dict() for record in ctl.history],
    }


def assert_trained_together(results: list[dict[str, Any]], label: str) -> None:
    reference = results[0]
    for rank, result in enumerate(results[1:], start=1):
        assert torch.equal(reference["params"], result["params"]), f"{label}: rank {rank} differs"
        assert reference["plans"] == result["plans"], f"{label}: rank {rank} plans differ"
    assert torch.isfinite(reference["params"]).all(), label
    losses = reference["losses"]
    start, end = sum(losses[:3]) / 3, sum(losses[-5:]) / 5
    assert end < 0.9 * start, f"{label}: loss did not fall ({start:.3f} -> {end:.3f})"


def test_static_plan_on_one_gpu_keeps_ranks_identical(tmp_path: Path) -> None:
    results = run_ranks(train, 2, tmp_path, "cuda:0", "static", "", timeout=360)
    assert_trained_together(results, "static on cuda")
    reference = results[0]
    assert reference["grad_device"].startswith("cuda")
    assert reference["buckets"] >= 3, reference["buckets"]
    assert reference["stats"]["compression_ratio"] > 1.5, reference["stats"]["compression_ratio"]


def test_adaptive_on_one_gpu_keeps_ranks_identical(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(train, 2, tmp_path / "ranks", "cuda:0", "adaptive", str(policy))
    assert_trained_together(results, "adaptive on cuda")
    reference = results[0]
    assert reference["clock"] == "CudaClock"
    final = reference["plans"][max(reference["plans"])]
    assert any(spec != "none" for spec in final.values()), final
    # Window timings come from CUDA events, read without waiting for the device: a step whose
    # events were still in flight is read at the next window, so some windows have timings.
    timed = [r for r in reference["history"] if r["step_seconds"] > 0]
    assert timed, reference["history"]


def coding_streams(rank: int, world_size: int) -> dict[str, Any]:
    """Train a few steps; return the CUDA streams the hook encoded and decoded on."""
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = MultiBucketNet().cuda()
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=0.02)
    autocomp.wrap(ddp, plan=EVERY_COMPRESSOR_PLAN)
    seen: dict[str, set[int]] = {"encode": set(), "decode": set()}
    encode, decode = autocomp.hook.encode_bucket, autocomp.hook.decode_into

    def encoding(*args: Any) -> Any:
        seen["encode"].add(torch.cuda.current_stream().stream_id)
        return encode(*args)

    def decoding(*args: Any) -> Any:
        seen["decode"].add(torch.cuda.current_stream().stream_id)
        return decode(*args)

    autocomp.hook.encode_bucket = encoding  # type: ignore[assignment]
    autocomp.hook.decode_into = decoding  # type: ignore[assignment]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(4):
        x, y = classification_batch(rank, step)
        loss = torch.nn.functional.cross_entropy(ddp(x.cuda()), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return {name: sorted(streams) for name, streams in seen.items()}


def test_decode_runs_on_the_stream_of_the_encode(tmp_path: Path) -> None:
    """The decode frees tensors the encode allocated (PowerSGD's basis, random-k's indices),
    so it must run on the encode's stream. Until 2026-11-26 it ran on the pool stream of a
    CUDA future's callback; the caching allocator then handed those blocks to the encode
    stream's next allocation under a still-queued decode, and ranks parted or died of a
    device-side assert (4 gloo ranks on one H200, the hierarchical hook)."""
    results = run_ranks(coding_streams, 2, tmp_path, timeout=240)
    for result in results:
        assert len(result["encode"]) == 1 and result["decode"] == result["encode"], result
