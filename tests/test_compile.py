"""Tier 2: ``torch.compile`` with autocomp on 2 local gloo ranks.

Both ways of combining them, ``torch.compile(ddp)`` and ``DDP(torch.compile(model))``, in
static and adaptive mode: the ranks stay bit-identical, the loss falls, and the adaptive
loop's window boundaries run (they live in the comm hook, which compiled code calls but does
not trace; a forward pre-hook issuing collectives was traced by dynamo on one rank only and
killed the job). The ``aot_eager`` backend keeps the test fast: what broke was dynamo's
tracing, which every backend shares, and DDP's graph splitting at bucket boundaries runs
as with inductor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from tests.boundaries import assert_plain_schedule, baseline_hold_steps
from tests.models import MultiBucketNet, classification_batch
from tests.multirank import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

STEPS = 10


def _compiled(rank: int, world: int, how: str, mode: str, run_dir: str) -> dict[str, Any]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MultiBucketNet()
    # Default buckets: dynamo's DDP graph split needs the first bucket to be the smallest.
    inner = torch.compile(model, backend="aot_eager") if how == "compile-inside" else model
    ddp = DDP(inner)
    if mode == "static":
        ctl = autocomp.wrap(ddp, plan={"*.bias": "none", "*": "powersgd:rank=2"})
    else:
        # Every window (no quiet stretch), so that the boundaries below are the plain schedule.
        config = autocomp.AutocompConfig(
            target_overlap=0.9,
            window=3,
            warmup_steps=3,
            run_dir=run_dir,
            quiet_window_seconds=0.0,
        )
        ctl = autocomp.wrap(ddp, config=config)
    runner = torch.compile(ddp, backend="aot_eager") if how == "compile-outside" else ddp
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        x, y = classification_batch(rank, step)
        loss = torch.nn.functional.cross_entropy(runner(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctl.observe_loss(loss.detach())
        losses.append(float(loss))
    return {
        "params": torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]),
        "losses": losses,
        "windows": [r.step for r in ctl.history],
        "baseline_holds": baseline_hold_steps((r.step, r.decision) for r in ctl.history),
        "steps": ctl.step,
    }


@pytest.mark.parametrize("mode", ["static", "adaptive"])
@pytest.mark.parametrize("how", ["compile-outside", "compile-inside"])
def test_compiled_training_keeps_ranks_identical(tmp_path: Path, how: str, mode: str) -> None:
    zero, one = run_ranks(_compiled, 2, tmp_path, how, mode, str(tmp_path / "runs"))
    assert torch.equal(zero["params"], one["params"])
    assert zero["steps"] == STEPS
    assert zero["losses"][-1] < zero["losses"][0]
    if mode == "adaptive":
        assert zero["windows"] == one["windows"]
        assert_plain_schedule(zero["windows"], [1, 2, 3, 6, 9], zero["baseline_holds"])
