"""Tier 2: convergence on real data under adaptive compression (2 local gloo ranks).

scikit-learn's bundled digits images, a small CNN. The same model and batches train once with
plain DDP and once under ``autocomp.wrap(target_overlap=0.9)``; rank 0's link fit is replaced
by a 50 Mbit/s link so the policy really compresses (loopback itself is fast). The compressed
run must reach the uncompressed run's validation accuracy within 1 point in the same number
of steps. The shaped-link benchmark (``autocomp-bench link``) runs the full-size version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from autocomp.link_model import LinkEstimate
from autocomp_bench.workloads import DigitsCNN, digits, digits_batch
from tests.multirank import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(400)]

STEPS = 300
LINK_50MBIT = LinkEstimate(
    latency_s=5e-4, bandwidth_bytes_per_s=50e6 / 8, samples=32, rel_residual=0.0
)


def _accuracy(model: torch.nn.Module) -> float:
    _, _, valid_x, valid_y = digits()
    with torch.no_grad():
        return float((model(valid_x).argmax(dim=1) == valid_y).float().mean())


def _train(rank: int, compressed: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    model = DigitsCNN()
    ddp = DDP(model)
    ctl = None
    if compressed:
        ctl = autocomp.wrap(ddp, target_overlap=0.9, window=10, warmup_steps=20)
        if rank == 0 and ctl.adaptive is not None:
            ctl.adaptive.meter.end_window = lambda **_: LINK_50MBIT  # type: ignore[method-assign]
            # Loopback steps do not get faster with compression: no payoff check here.
            ctl.adaptive.payoff.hold_reason = lambda *_: None  # type: ignore[method-assign]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = digits_batch(32, rank, step)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if ctl is not None:
            ctl.observe_loss(float(loss.detach()))
    stats = ctl.stats() if ctl is not None else None
    return {
        "accuracy": _accuracy(model),
        "plan": None if ctl is None else ctl.plan,
        "ratio": None if stats is None else stats["compression_ratio"],
    }


def _both(rank: int, world_size: int) -> dict[str, Any]:
    return {"plain": _train(rank, False), "autocomp": _train(rank, True)}


def test_compressed_training_matches_uncompressed_accuracy(tmp_path: Path) -> None:
    results = run_ranks(_both, 2, tmp_path)
    plain = results[0]["plain"]["accuracy"]
    compressed = results[0]["autocomp"]["accuracy"]
    plan = results[0]["autocomp"]["plan"]
    assert any(spec != "none" for spec in plan.values()), plan
    assert results[0]["autocomp"]["ratio"] > 2.0
    assert plain > 0.9, plain
    assert compressed >= plain - 0.01, (plain, compressed, plan)
