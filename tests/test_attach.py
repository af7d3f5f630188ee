"""Tier 2: attaching autocomp on local gloo ranks, and the failures that must not hang.

- ``make_hook`` gives a ``(state, hook)`` pair that plain ``ddp.register_comm_hook`` takes; the
  state binds at the first backward and trains like ``wrap`` (bit-identical ranks, same
  parameters as ``wrap`` with the same settings), or earlier with ``state.bind``;
  ``AutocompConfig.from_toml`` reads a policy file with an ``[autocomp]`` table.
- DDP ``join()`` is refused with a clear error on every rank (its shadow all-reduces could not
  match compressed collectives), and works after ``close()``.
- A run log rank 0 cannot create fails on every rank at ``wrap``, within a short timeout.
- ``ctl.summary()`` works before the first window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from tests.models import MultiBucketNet, classification_batch
from tests.multirank import rank_errors, run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

PLAN = {"*.bias": "none", "*": "powersgd:rank=2"}


def _train(ddp: DDP, rank: int, steps: int = 12) -> list[float]:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        x, y = classification_batch(rank, step)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _make_hook_vs_wrap(rank: int, world: int, eager_bind: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    hooked = DDP(MultiBucketNet(), bucket_cap_mb=0.02)
    state, hook = autocomp.make_hook(autocomp.AutocompConfig(plan=PLAN))
    if eager_bind:
        state.bind(hooked)
    else:
        assert state.controller is None
    hooked.register_comm_hook(state, hook)
    losses = _train(hooked, rank)
    assert state.controller is not None
    torch.manual_seed(0)
    wrapped = DDP(MultiBucketNet(), bucket_cap_mb=0.02)
    ctl = autocomp.wrap(wrapped, plan=PLAN)
    _train(wrapped, rank)
    return {
        "hooked": _flat(hooked.module),
        "wrapped": _flat(wrapped.module),
        "losses": losses,
        "plan": state.controller.plan,
        "wrap_plan": ctl.plan,
    }


@pytest.mark.parametrize("eager_bind", [False, True])
def test_make_hook_trains_like_wrap(tmp_path: Path, eager_bind: bool) -> None:
    results = run_ranks(_make_hook_vs_wrap, 2, tmp_path, eager_bind)
    zero, one = results
    assert torch.equal(zero["hooked"], one["hooked"])
    assert torch.equal(zero["hooked"], zero["wrapped"])  # same hook, same numbers
    assert zero["plan"] == zero["wrap_plan"]
    assert zero["plan"]["fc1.weight"] == "powersgd:rank=2,ef=true"
    assert zero["losses"][-1] < zero["losses"][0]


def _adaptive_make_hook(rank: int, world: int, run_dir: str) -> dict[str, Any]:
    torch.manual_seed(0)
    ddp = DDP(MultiBucketNet(), bucket_cap_mb=0.02)
    config = autocomp.AutocompConfig(
        target_overlap=0.9,
        window=4,
        warmup_steps=4,
        run_dir=run_dir,
        quiet_window_seconds=0.0,  # the plain schedule, checked below
    )
    state, hook = autocomp.make_hook(config)
    ddp.register_comm_hook(state, hook)
    _train(ddp, rank, steps=10)
    ctl = state.controller
    assert ctl is not None and ctl.mode == "adaptive"
    return {"records": [r.step for r in ctl.history], "params": _flat(ddp.module)}


def test_make_hook_runs_the_adaptive_loop_from_the_hook(tmp_path: Path) -> None:
    zero, one = run_ranks(_adaptive_make_hook, 2, tmp_path, str(tmp_path / "runs"))
    # The glance after the first step (1), the first look (2), the end of warm-up (4) and a
    # window boundary (8), all from the hook.
    assert zero["records"] == one["records"] == [1, 2, 4, 8]
    assert torch.equal(zero["params"], one["params"])


def test_config_from_toml_reads_the_policy_and_an_autocomp_table(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        "[policy]\nwarmup_steps = 7\ntarget_overlap = 0.8\n"
        '[autocomp]\nwindow = 6\nplan = {"*.bias" = "none"}\n'
    )
    config = autocomp.AutocompConfig.from_toml(path, seed=3)
    resolved = config.resolve()
    assert (config.window, config.seed, config.target_overlap) == (6, 3, 0.8)
    assert resolved.policy is not None and resolved.policy.warmup_steps == 7
    assert [r.pattern for r in resolved.rules.rules] == ["*.bias"]
    preset = autocomp.AutocompConfig.from_toml("wan")
    assert preset.adaptive and preset.target_overlap == 0.95
    bad = tmp_path / "bad.toml"
    bad.write_text("[autocomp]\nwindoww = 3\n")
    with pytest.raises(ValueError, match=r"unknown key.*windoww"):
        autocomp.AutocompConfig.from_toml(bad)


def _join(rank: int, world: int, how: str) -> str:
    module = MultiBucketNet()
    ddp = DDP(module)
    if how == "wrap":
        autocomp.wrap(ddp, plan=PLAN)
    else:  # bound to the inner module: the DDP model is found at the hook's first call
        state, hook = autocomp.make_hook(autocomp.AutocompConfig(plan=PLAN))
        state.bind(module)
        ddp.register_comm_hook(state, hook)
        _train(ddp, rank, steps=1)
    try:
        with ddp.join():
            pass
    except RuntimeError as err:
        return str(err)
    return "no error"


@pytest.mark.parametrize("how", ["wrap", "make_hook_bound_to_module"])
def test_join_is_refused_on_every_rank(tmp_path: Path, how: str) -> None:
    for message in run_ranks(_join, 2, tmp_path, how, timeout=60):
        assert "join() (uneven inputs) cannot be used with autocomp" in message


def _join_after_close(rank: int, world: int) -> int:
    torch.manual_seed(0)
    ddp = DDP(MultiBucketNet(), bucket_cap_mb=0.02)
    ctl = autocomp.wrap(ddp, plan=PLAN)
    _train(ddp, rank, steps=3)
    ctl.close()  # every rank, between the same two steps: plain all-reduces from here
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    steps = 4 + rank  # uneven inputs: rank 0 joins early
    with ddp.join():
        for step in range(steps):
            x, y = classification_batch(rank, 10 + step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
    return steps


def test_join_works_after_close(tmp_path: Path) -> None:
    """The refusal's message says close() makes join() usable; it does (no hang, no error)."""
    assert run_ranks(_join_after_close, 2, tmp_path, timeout=120) == [4, 5]


def _unwritable_run_log(rank: int, world: int, blocker: str) -> None:
    ddp = DDP(MultiBucketNet())
    # Rank 0 alone opens the run log; a file where its directory should be makes that fail.
    autocomp.wrap(ddp, target_overlap=0.9, run_dir=str(Path(blocker) / "run"))


def test_a_run_log_failure_on_rank_0_is_raised_on_every_rank(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    with pytest.raises(AssertionError, match="failed"):
        run_ranks(_unwritable_run_log, 2, tmp_path / "ranks", str(blocker), timeout=90)
    errors = rank_errors(tmp_path / "ranks", 2)
    assert set(errors) == {0, 1}, "every rank must raise, none may hang"
    assert "adaptive setup" in errors[1] and "another rank" in errors[1]


def _summary_before_any_window(rank: int, world: int, run_dir: str) -> list[str]:
    ddp = DDP(MultiBucketNet())
    ctl = autocomp.wrap(ddp, target_overlap=0.9, window=50, run_dir=run_dir)
    before = ctl.summary()
    _train(ddp, rank, steps=1)  # the first boundary is the glance before step 1's backward
    return [before, ctl.summary(), str(len(ctl.history))]


def test_summary_works_before_the_first_window(tmp_path: Path) -> None:
    before, after, windows = run_ranks(
        _summary_before_any_window, 2, tmp_path, str(tmp_path / "runs")
    )[0]
    assert before.startswith("step      0: 0/") and "no window boundary yet" in before
    assert after.startswith("step      1:") and windows == "0"
