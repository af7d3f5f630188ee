"""Tier 2: DCP-native checkpoints of the controller on local gloo ranks.

``torch.distributed.checkpoint`` saves identical keys once: before the rank namespace, rank 0
silently loaded one of rank 1's error-feedback residuals. Here:

- a fresh controller (no residual yet) is a valid load template, and a save/load through DCP
  round-trips each rank's own residuals and compressor state bit-exactly; training then
  continues exactly as without the interruption;
- adaptive mode round-trips too (plan, planner state on every rank);
- a checkpoint from 2 ranks resumes on 3 (``autocomp.ElasticLoadPlanner``): plan and step
  carry over, residuals start afresh, training goes on; never an error mid-training. That
  planner leaves out only autocomp's absent rank entries: a missing model key still fails
  (tier 1, one process).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from tests.models import MultiBucketNet, classification_batch
from tests.multirank import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

PLAN = {"*.bias": "none", "fc1.weight": "powersgd:rank=2", "*": "topk:ratio=0.05"}


def _steps(ddp: DDP, opt: torch.optim.Optimizer, rank: int, start: int, stop: int) -> None:
    for step in range(start, stop):
        x, y = classification_batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()


def _fresh(seed: int, **wrap: Any) -> tuple[torch.nn.Module, DDP, Any, autocomp.Controller]:
    torch.manual_seed(seed)
    model = MultiBucketNet()
    ddp = DDP(model, bucket_cap_mb=0.02)
    ctl = autocomp.wrap(ddp, **wrap)
    return model, ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), ctl


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _dcp_round_trip(rank: int, world: int, path: str, adaptive: bool) -> dict[str, Any]:
    wrap = (
        {"target_overlap": 0.9, "window": 3, "warmup_steps": 2, "run_dir": False}
        if adaptive
        else {"plan": PLAN}
    )
    model, ddp, opt, _ = _fresh(0, **wrap)
    _steps(ddp, opt, rank, 0, 10)
    uninterrupted = _flat(model)

    model, ddp, opt, ctl = _fresh(0, **wrap)
    _steps(ddp, opt, rank, 0, 6)
    residuals = {
        n: s.residual.clone() for n, s in ctl._state.slots.items() if s.residual is not None
    }
    dcp.save({"model": model.state_dict(), "opt": opt.state_dict(), "ac": ctl}, checkpoint_id=path)
    planner = ctl.adaptive.planner.state_dict() if ctl.adaptive else None

    model2, ddp2, opt2, ctl2 = _fresh(7, **wrap)  # other init: all must come from the checkpoint
    template = ctl2.state_dict()  # before any step: every residual a zero tensor, none missing
    assert all(isinstance(v, torch.Tensor) for v in template[f"rank{rank}"]["residual"].values())
    state = {"model": model2.state_dict(), "opt": opt2.state_dict(), "ac": ctl2}
    dcp.load(state, checkpoint_id=path)
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["opt"])
    restored = {
        n: s.residual.clone() for n, s in ctl2._state.slots.items() if s.residual is not None
    }
    same_planner = planner is None or (
        ctl2.adaptive is not None and ctl2.adaptive.planner.state_dict() == planner
    )
    _steps(ddp2, opt2, rank, 6, 10)
    return {
        "saved": residuals,
        "restored": restored,
        "uninterrupted": uninterrupted,
        "resumed": _flat(model2),
        "plan": ctl2.plan,
        "same_planner": same_planner,
        "step": ctl2.step,
    }


@pytest.mark.parametrize("adaptive", [False, True], ids=["static", "adaptive"])
def test_dcp_round_trips_each_ranks_own_residuals(tmp_path: Path, adaptive: bool) -> None:
    results = run_ranks(_dcp_round_trip, 2, tmp_path / "ranks", str(tmp_path / "ckpt"), adaptive)
    for out in results:
        assert out["saved"].keys() == out["restored"].keys()
        for name, tensor in out["saved"].items():
            assert torch.equal(tensor, out["restored"][name]), name
        assert out["same_planner"] and out["step"] == 10
        if not adaptive:  # adaptive decisions depend on measured timings, which vary
            assert torch.equal(out["uninterrupted"], out["resumed"])
    if not adaptive:
        # The ranks' residuals differ (their data differ): a shared key would have mixed them.
        assert results[0]["saved"], "the test needs residuals to compare"
        name = next(iter(results[0]["saved"]))
        assert not torch.equal(results[0]["saved"][name], results[1]["saved"][name])


def _save_at(rank: int, world: int, path: str) -> dict[str, str]:
    _, ddp, opt, ctl = _fresh(0, plan=PLAN)
    _steps(ddp, opt, rank, 0, 5)
    dcp.save({"ac": ctl}, checkpoint_id=path)
    return ctl.plan


def _resume_at(rank: int, world: int, path: str) -> dict[str, Any]:
    _, ddp, opt, ctl = _fresh(0, plan=PLAN)
    planner = autocomp.ElasticLoadPlanner("ac")
    dcp.load({"ac": ctl}, checkpoint_id=path, planner=planner)
    step = ctl.step
    residuals = [s.residual for s in ctl._state.slots.values()]
    _steps(ddp, opt, rank, 5, 8)
    return {
        "step": step,
        "fresh": all(r is None for r in residuals),
        "after": ctl.step,
        "skipped": sorted({key.split(".")[1] for key in planner.skipped}),
    }


def test_a_two_rank_checkpoint_resumes_on_three_ranks(tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    run_ranks(_save_at, 2, tmp_path / "save", ckpt)
    for rank, out in enumerate(run_ranks(_resume_at, 3, tmp_path / "resume", ckpt)):
        assert out["step"] == 5 and out["fresh"] and out["after"] == 8
        # Only the new rank's entry is absent from the checkpoint; nothing else is left out.
        assert out["skipped"] == (["rank2"] if rank == 2 else []), (rank, out["skipped"])


def test_the_elastic_planner_still_checks_other_keys(tmp_path: Path) -> None:
    """A model key missing from the checkpoint still fails, as with DCP's default planner."""
    path = str(tmp_path / "ckpt")
    dcp.save({"model": {"w": torch.zeros(2)}}, checkpoint_id=path, no_dist=True)
    template = {"model": {"w": torch.ones(2), "extra": torch.ones(1)}}
    with pytest.raises(BaseException, match="Missing key"):  # DCP's CheckpointException
        dcp.load(template, checkpoint_id=path, planner=autocomp.ElasticLoadPlanner(), no_dist=True)
    with pytest.raises(ValueError, match="top-level name"):
        autocomp.ElasticLoadPlanner("a.b")
