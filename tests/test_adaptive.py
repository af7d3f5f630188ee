"""Tier 2: the adaptive window loop on local gloo ranks.

Loopback is a fast link, where the right answer is to compress nothing; to exercise real
decisions these tests replace rank 0's link fit with a fixed slow link (10 Mbit/s; 0.1 Mbit/s
for the opening), so the policy compresses. Everything else is real: the profiler, the
all-reduce of measurements, the rank-0 decision, the broadcast and the switch.

Covers: every rank holds the same plan at every window and switches at the same step (the
opening at step 0 included, and the warm-up's plan it may run at step 0 alone), with
bit-identical parameters; the fast (real loopback) link
keeps everything uncompressed; each convergence guard fires on an injected fault (NaN
gradient, loss spike, gradient-norm jump, runaway residual) and the plan reacts; the warm-up
runs fp16 and int8 at most; checkpoints
restore the adaptive plan and state; a layer's measured hook cost includes its decode; a
settled uncompressed plan stretches the windows alike on every rank, and a short window rank 0
asks for ends at the same step on every rank; an unsettled contention
reading from the opening (none, or under twice the noise cut) is taken again at a boundary
once a layer is compressed, and the larger stands; the calibration at wrap also times the
model's largest matrix.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from autocomp.adaptive import MAX_QUIET_WINDOWS
from autocomp.link_model import LinkEstimate
from tests.models import MultiBucketNet, classification_batch
from tests.multirank import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

WINDOW = 4
POLICY = """
version = 1
[policy]
description = "test: small tensors allowed"
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
CRAWLING_LINK = LinkEstimate(
    latency_s=1e-3, bandwidth_bytes_per_s=0.1e6 / 8, samples=16, rel_residual=0.0
)
"""0.1 Mbit/s: 120 KB of gradients take 10 s, so the opening's bar (5x three first forwards)
holds for any first forward under 0.67 s. At 1 Mbit/s (1 s, a bar of 67 ms) the agreement
test failed as the first test of a run, twice in two sessions: the opening left step 0
uncompressed (its first switch came at step 1); a cold process's first forward is the
likely reason (it is reported in the assertion now)."""
FAST_LINK = LinkEstimate(
    latency_s=50e-6, bandwidth_bytes_per_s=10e9 / 8, samples=16, rel_residual=0.0
)
"""10 Gbit/s, above the tests' 0.5 Gbit/s fast-link threshold: for checks of what follows a
fast link that must not depend on what loopback measures. This model's windows are too small
to re-measure the link (``BandwidthMeter.blind``), so the first glance's reading stands. Under
load (CI; here, four CPU hogs) it read 44 Mbit/s, the plan compressed, and the stretch came late."""


def _setup(
    rank: int, policy_path: str, slow: bool = True, link: LinkEstimate = SLOW_LINK, **kwargs: Any
) -> tuple[torch.nn.Module, DDP, torch.optim.Optimizer, autocomp.Controller]:
    torch.manual_seed(0)
    model = MultiBucketNet()
    ddp = DDP(model, bucket_cap_mb=0.02)
    # The plain schedule, a boundary every window: any decision costs more than its share of
    # these few-millisecond windows, and a settled compressed plan would stretch them.
    kwargs.setdefault("quiet_window_seconds", 0.0)
    config = autocomp.AutocompConfig(
        target_overlap=0.9, policy=policy_path, window=WINDOW, **kwargs
    )
    ctl = autocomp.wrap(ddp, config=config)
    assert ctl.adaptive is not None
    if slow and rank == 0:
        # An injected link: loopback steps do not get faster with compression, which the
        # payoff check (tests/test_payoff.py) would rightly notice; here it is out of play.
        ctl.adaptive.meter.end_window = lambda **_: link  # type: ignore[method-assign]
        ctl.adaptive.payoff.hold_reason = lambda *_: None  # type: ignore[method-assign]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    return model, ddp, opt, ctl


def _train_step(
    ctl: autocomp.Controller, ddp: DDP, opt: torch.optim.Optimizer, rank: int, step: int
) -> float:
    x, y = classification_batch(rank, step)
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    grads_finite = all(
        p.grad is None or bool(torch.isfinite(p.grad).all()) for p in ddp.parameters()
    )
    if grads_finite:  # what AMP's GradScaler does: skip steps with non-finite gradients
        opt.step()
    return float(loss.detach())


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _agreement(rank: int, world_size: int, policy_path: str, opening: bool) -> dict[str, Any]:
    link = CRAWLING_LINK if opening else SLOW_LINK
    model, ddp, opt, ctl = _setup(rank, policy_path, link=link, opening=opening)
    plans_by_step = {}
    for step in range(6 * WINDOW):
        _train_step(ctl, ddp, opt, rank, step)
        plans_by_step[ctl.step] = dict(ctl.plan)
    return {
        "plans": plans_by_step,
        "switches": [(r.step, sorted(r.changes.items())) for r in ctl.history],
        "probes": [r.probe_bytes for r in ctl.history if r.step == 0],
        "first_forward": None if ctl.adaptive is None else ctl.adaptive.first_forward_seconds,
        "params": _flat(model),
        "reasons": None
        if ctl.last_decision is None
        else {d.name: d.reason for d in ctl.last_decision.layers},
    }


@pytest.mark.parametrize(("world_size", "opening"), [(2, True), (3, False)])
def test_every_rank_holds_the_same_plan_and_switches_at_the_same_step(
    world_size: int, opening: bool, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(_agreement, world_size, tmp_path / "ranks", str(policy), opening)
    reference = results[0]
    for result in results[1:]:
        assert result["plans"] == reference["plans"]
        assert result["switches"] == reference["switches"]
        assert result["probes"] == reference["probes"]
        assert torch.equal(result["params"], reference["params"])
    plans = reference["plans"]
    first_switch = next(step for step, changes in reference["switches"] if changes)
    if opening:
        # The opening probes the (injected, 0.1 Mbit/s) link before step 0's first collective:
        # 120 KB of gradients take 10 s, over 5x three of any first forward here, so the first
        # step already compresses, on every rank alike.
        opened = first_switch == 0 and reference["probes"] and reference["probes"][0] > 0
        assert opened, (first_switch, reference["probes"], reference["first_forward"])
        assert any(spec != "none" for spec in plans[1].values())
    else:
        # The warm-up's first step is uncompressed. The glance after it (step 1: one step
        # cannot end the warm-up) may move layers to the warm-up's accurate options only;
        # the first look (step 2: the link is slow, the warm-up ends) or a boundary opens
        # the rest.
        assert all(spec == "none" for spec in plans[1].values())
        assert first_switch in (1, 2) or first_switch % WINDOW == 0
        for step, changes in reference["switches"]:
            if step == 1:
                assert changes
                assert all(new.split(":")[0] in ("fp16", "int8") for _, (_, new) in changes)
    compressed = {n: s for n, s in plans[max(plans)].items() if s != "none"}
    assert compressed, plans[max(plans)]
    reasons = reference["reasons"]
    assert reasons is not None and all(reasons.values())
    # 1-D tensors only ever ride along with their bucket's lossless cast.
    for name, spec in compressed.items():
        if name.endswith(".bias"):
            assert spec in ("fp16:ef=false", "bf16:ef=false"), (name, spec)
            assert "rides along with its bucket's" in reasons[name], reasons[name]
    optimizer_heads = ("knapsack", "infeasible", "fastest", "target out of reach")
    assert any(head in r for r in reasons.values() for head in optimizer_heads)


def _opening_start(rank: int, world_size: int, policy_path: str, cost_steps: float) -> dict:
    model, ddp, opt, ctl = _setup(rank, policy_path, link=CRAWLING_LINK)
    assert ctl.adaptive is not None
    if rank == 0:  # only rank 0 decides; the others follow its broadcast
        ctl.adaptive.planner.config.start_cost_steps = cost_steps
    ran = []
    for step in range(3):
        _train_step(ctl, ddp, opt, rank, step)
        ran.append(dict(ctl.plan))  # what this step's buckets were sent with
    opening = ctl.history[0]
    return {
        "ran": ran,
        "plan": {name: new for name, (_, new) in opening.changes.items()},
        "start": None if opening.decision is None else opening.decision.get("start"),
        "params": _flat(model),
    }


@pytest.mark.parametrize("cost_steps", [1e6, 0.0])
def test_an_affordable_warm_up_step_runs_before_the_openings_plan(
    cost_steps: float, tmp_path: Path
) -> None:
    """When the opening compresses, step 0 may run the warm-up's plan (int8 and fp16 here)
    and the opening's plan take over at step 1, on every rank at the same step; with
    ``start_cost_steps`` 0 the plan runs from step 0."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(_opening_start, 2, tmp_path / "ranks", str(policy), cost_steps)
    for result in results[1:]:
        assert result["ran"] == results[0]["ran"]
        assert torch.equal(result["params"], results[0]["params"])
    ran, plan, start = results[0]["ran"], results[0]["plan"], results[0]["start"]
    lossy = {n for n, s in plan.items() if s.split(":")[0] in ("powersgd", "topk")}
    assert lossy, plan
    assert all(ran[1][n] == plan[n] for n in plan)  # the opening's plan from step 1 on
    if cost_steps == 0:
        assert start is None and all(ran[0][n] == plan[n] for n in plan)
        return
    assert start is not None and start["predicted_step_seconds"] > 0
    assert set(start["plan"]) == lossy
    for name in lossy:
        assert (
            ran[0][name].split(":")[0] in ("fp16", "int8") and ran[0][name] == start["plan"][name]
        )


def _fast_link(rank: int, world_size: int, policy_path: str) -> dict[str, Any]:
    # Big enough (1.3M parameters) that transfers, not latency, make up the communication.
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 5),
    )
    ddp = DDP(model)
    ctl = autocomp.wrap(ddp, target_overlap=0.9, policy=policy_path, window=WINDOW)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(5 * WINDOW):
        _train_step(ctl, ddp, opt, rank, step)
    return {"plan": ctl.plan, "history": [r.to_dict() for r in ctl.history]}


def test_measured_fast_link_keeps_everything_uncompressed(tmp_path: Path) -> None:
    """The real loopback link, measured live, is above this policy's fast-link threshold.

    (Loopback measures 1-15 Gbit/s here, below the presets' 25 Gbit/s; for this small model
    none vs PowerSGD is then a genuine near-tie in predicted time, so the test sets the
    threshold to 0.5 Gbit/s to check the rule deterministically on a real measurement.)
    """
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace("fast_link_gbit = 25.0", "fast_link_gbit = 0.5"))
    results = run_ranks(_fast_link, 2, tmp_path / "ranks", str(policy))
    assert set(results[0]["plan"].values()) == {"none"}
    decided = [h for h in results[0]["history"] if h["decision"] is not None]
    # The glance after the first step has one all-reduce to go by, which on loopback may be
    # too quick to measure the link with; it keeps the warm-up either way.
    assert decided and decided[0]["step"] == 1
    assert all(layer["spec"] == "none" for layer in decided[0]["decision"]["layers"])
    decided = decided[1:]
    assert decided
    for record in decided:
        measured = record["bandwidth_bytes_per_s"]
        assert measured is not None and measured * 8 > 0.5e9, measured
        for layer in record["decision"]["layers"]:
            assert layer["spec"] == "none", layer
    reasons = {layer["reason"] for layer in decided[-1]["decision"]["layers"]}
    assert any(reason.startswith("fast link") for reason in reasons), reasons


def _quiet(rank: int, world_size: int, policy_path: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 5))
    ddp = DDP(model)
    config = autocomp.AutocompConfig(
        target_overlap=0.9, policy=policy_path, window=WINDOW, quiet_window_seconds=1000.0
    )
    ctl = autocomp.wrap(ddp, config=config)
    assert ctl.adaptive is not None
    if rank == 0:
        ctl.adaptive.meter.end_window = lambda **_: FAST_LINK  # type: ignore[method-assign]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(4 * WINDOW + 2 * MAX_QUIET_WINDOWS * WINDOW):
        _train_step(ctl, ddp, opt, rank, step)
    return {
        "plan": ctl.plan,
        "steps": [r.step for r in ctl.history],
        "params": _flat(model),
    }


def test_a_settled_uncompressed_plan_stretches_the_windows(tmp_path: Path) -> None:
    """On a fast link (injected on rank 0) every layer stays uncompressed; once the warm-up is over
    and the plan holds, rank 0's broadcast stretches the windows (to ``MAX_QUIET_WINDOWS``
    here, with ``quiet_window_seconds`` far above any window), and every rank skips the same
    boundaries: the boundary-time collectives stay matched and the parameters identical."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace("fast_link_gbit = 25.0", "fast_link_gbit = 0.5"))
    results = run_ranks(_quiet, 2, tmp_path / "ranks", str(policy))
    reference = results[0]
    assert set(reference["plan"].values()) == {"none"}
    assert results[1]["steps"] == reference["steps"]
    assert torch.equal(results[1]["params"], reference["params"])
    steps = reference["steps"]
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    assert MAX_QUIET_WINDOWS * WINDOW in gaps, steps
    # Without the stretch the run would hold a boundary every window after the warm-up.
    after_warmup = [s for s in steps if s > 4]
    assert len(after_warmup) <= 3, steps


def _settled(rank: int, world_size: int, policy_path: str) -> dict[str, Any]:
    import autocomp.adaptive as adaptive

    # Any decision now costs more than the share: a kept compressed plan stretches at once.
    adaptive.QUIET_BOUNDARY_SHARE = 1e-9
    model, ddp, opt, ctl = _setup(rank, policy_path, quiet_window_seconds=2.0)
    plans = {}
    for step in range(10 * WINDOW + 4 * adaptive.MAX_SETTLED_WINDOWS * WINDOW):
        _train_step(ctl, ddp, opt, rank, step)
        plans[step] = dict(ctl.plan)  # what a boundary at this step decided
    return {"steps": [r.step for r in ctl.history], "plans": plans, "params": _flat(model)}


def test_a_settled_compressed_plan_stretches_the_windows_alike_on_every_rank(
    tmp_path: Path,
) -> None:
    """A compressed plan kept for ``SETTLED_DECISIONS`` decisions, with decisions costlier
    than their share of a window (forced here), stretches the windows to
    ``MAX_SETTLED_WINDOWS``: every rank skips the same boundaries, so the boundary-time
    collectives stay matched and the parameters identical."""
    from autocomp.adaptive import MAX_SETTLED_WINDOWS, SETTLED_DECISIONS

    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(_settled, 2, tmp_path / "ranks", str(policy))
    reference = results[0]
    assert results[1]["steps"] == reference["steps"]
    assert torch.equal(results[1]["params"], reference["params"])
    steps, plans = reference["steps"], reference["plans"]
    stretched = [a for a, b in itertools.pairwise(steps) if b - a == MAX_SETTLED_WINDOWS * WINDOW]
    assert stretched, steps
    for start in stretched:
        assert set(plans[start].values()) != {"none"}, (start, plans[start])
        # Only after the plan was kept: the boundaries before it ran the same plan.
        before = [s for s in steps if s < start][-SETTLED_DECISIONS:]
        assert all(plans[s] == plans[start] for s in before), (start, steps)


def _short_window(rank: int, world_size: int, policy_path: str) -> dict[str, Any]:
    model, ddp, opt, ctl = _setup(rank, policy_path)
    assert ctl.adaptive is not None
    if rank == 0:
        planner = ctl.adaptive.planner
        decide = planner.decide

        def decide_then_ask(m: Any, current: dict[str, str], **kwargs: Any) -> Any:
            update = decide(m, current, **kwargs)
            # What a baseline's first window asks for (``PayoffCheck.baseline_window_steps``).
            return replace(update, window_steps=3) if m.step == 2 * WINDOW else update

        planner.decide = decide_then_ask  # type: ignore[method-assign]
    for step in range(5 * WINDOW):
        _train_step(ctl, ddp, opt, rank, step)
    return {"steps": [r.step for r in ctl.history], "params": _flat(model)}


def test_a_short_window_rank_0_asks_for_ends_at_the_same_step_on_every_rank(
    tmp_path: Path,
) -> None:
    """Rank 0's broadcast at the boundary of step 8 asks for the next one 3 steps later (an
    uncompressed baseline's short window): every rank runs it at step 11, the regular
    schedule goes on from there, and the parameters stay identical."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(_short_window, 2, tmp_path / "ranks", str(policy))
    steps = results[0]["steps"]
    assert results[1]["steps"] == steps
    assert torch.equal(results[1]["params"], results[0]["params"])
    after = [s for s in steps if s >= 2 * WINDOW]
    assert after == [8, 11, 12, 16], steps


def _guard_counts(ctl: autocomp.Controller) -> dict[str, int]:
    assert ctl.adaptive is not None
    return ctl.adaptive.guards.counts()


def _nan_gradient(rank: int, world_size: int, policy_path: str) -> dict[str, Any]:
    model, ddp, opt, ctl = _setup(rank, policy_path)
    target = "fc2.weight"
    poison_step = 3 * WINDOW + 1
    state = {"step": 0}

    def poison(grad: torch.Tensor) -> torch.Tensor:
        if rank == 0 and state["step"] == poison_step:
            grad = grad.clone()
            grad[0, 0] = float("nan")
        return grad

    model.fc2.weight.register_hook(poison)
    slot = ctl._state.slots[target]
    sent = []
    for step in range(5 * WINDOW):
        state["step"] = step
        before = slot.bytes_sent
        _train_step(ctl, ddp, opt, rank, step)
        sent.append(slot.bytes_sent - before)
    return {
        "spec_at_poison": ctl.history[-1].to_dict()["changes"],
        "sent": sent,
        "raw": slot.numel * 4,
        "events": list(ctl._state.nonfinite_events)
        + [
            (e.step, e.layer)
            for e in (ctl.adaptive.guards.events if rank == 0 and ctl.adaptive else [])
            if e.guard == "nonfinite"
        ],
        "counts": _guard_counts(ctl),
        "params": _flat(model),
        "poison_step": poison_step,
    }


def test_nan_gradient_resets_error_feedback_and_sends_uncompressed(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(_nan_gradient, 2, tmp_path / "ranks", str(policy))
    for result in results:
        assert torch.isfinite(result["params"]).all()
        assert torch.equal(result["params"], results[0]["params"])
        step = result["poison_step"]
        sent = result["sent"]
        # Compressed before, full size on the step after the NaN, compressed again after.
        assert sent[step] < result["raw"]
        assert sent[step + 1] == result["raw"]
        assert sent[step + 2] < result["raw"]
    # Rank 0 (which decides) recorded the event at the next boundary, for that layer only
    # (the NaN residual sampled on the poisoned step may add a second record of the fault).
    assert results[0]["counts"]["nonfinite"] >= 1
    assert {layer for _, layer in results[0]["events"]} == {"fc2.weight"}


def _loss_spike(rank: int, world_size: int, policy_path: str) -> dict[str, Any]:
    _, ddp, opt, ctl = _setup(rank, policy_path)
    specs = []
    for step in range(12 * WINDOW):
        loss = _train_step(ctl, ddp, opt, rank, step)
        # From step 24 on the observed loss is 5x higher and keeps rising: divergence.
        observed = loss * (5.0 + 0.2 * (step - 24)) if step >= 24 else loss
        ctl.observe_loss(observed)
        specs.append(dict(ctl.plan))
    assert ctl.adaptive is not None
    events = [e.to_dict() for e in ctl.adaptive.guards.events]
    return {"specs": specs, "events": events, "backoff": ctl.adaptive.guards.backoff()}


def test_loss_divergence_backs_compression_off(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(_loss_spike, 2, tmp_path / "ranks", str(policy))
    assert results[0]["specs"] == results[1]["specs"]
    events = [e for e in results[0]["events"] if e["guard"] == "loss_divergence"]
    assert events, results[0]["events"]
    assert events[0]["step"] >= 24
    assert all(level >= 1 for level in results[0]["backoff"].values())
    before = results[0]["specs"][23]
    after = results[0]["specs"][-1]
    # Every layer compressed before the spike is now lighter (or uncompressed).
    assert any(before[n] != after[n] for n in before if before[n] != "none"), (before, after)


def _critical_regime(rank: int, world_size: int, policy_path: str) -> dict[str, Any]:
    model, ddp, opt, ctl = _setup(rank, policy_path)
    state = {"step": 0}

    def amplify(grad: torch.Tensor) -> torch.Tensor:
        return grad * 20.0 if state["step"] >= 4 * WINDOW else grad

    model.fc3.weight.register_hook(amplify)
    for step in range(7 * WINDOW):
        state["step"] = step
        _train_step(ctl, ddp, opt, rank, step)
    assert ctl.adaptive is not None
    return {
        "events": [e.to_dict() for e in ctl.adaptive.guards.events],
        "backoff": ctl.adaptive.guards.backoff(),
    }


def test_gradient_norm_jump_is_a_critical_regime_for_that_layer(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(_critical_regime, 2, tmp_path / "ranks", str(policy))
    critical = [e for e in results[0]["events"] if e["guard"] == "critical_regime"]
    assert any(e["layer"] == "fc3.weight" and e["step"] >= 4 * WINDOW for e in critical), critical
    assert results[0]["backoff"]["fc3.weight"] >= 1


def _runaway_residual(rank: int, world_size: int, policy_path: str) -> dict[str, Any]:
    _, ddp, opt, ctl = _setup(rank, policy_path)
    inject_step = 4 * WINDOW + 1
    target = None
    for step in range(7 * WINDOW):
        if step == inject_step:
            # A compressor that sends a small part of its input per step: int8 or fp16 would
            # send a 1e4x residual at once (the next residual is ~1% of it) and never let it
            # run away, so they are not what this guard is for.
            compressed = [
                s
                for s in ctl._state.slots.values()
                if s.residual is not None
                and s.numel > 1000
                and s.compressor.name in ("powersgd", "topk")
            ]
            target = compressed[0].name
            compressed[0].residual.mul_(1e4)  # type: ignore[union-attr]
        _train_step(ctl, ddp, opt, rank, step)
    assert ctl.adaptive is not None
    return {
        "target": target,
        "events": [e.to_dict() for e in ctl.adaptive.guards.events],
        "backoff": ctl.adaptive.guards.backoff(),
        "params_finite": bool(torch.isfinite(_flat(ddp.module)).all()),
    }


def test_runaway_residual_is_reset_and_backed_off(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(_runaway_residual, 2, tmp_path / "ranks", str(policy))
    target = results[0]["target"]
    assert target is not None and results[1]["target"] == target
    growth = [e for e in results[0]["events"] if e["guard"] == "residual_growth"]
    assert any(e["layer"] == target for e in growth), results[0]["events"]
    assert results[0]["backoff"][target] >= 1
    assert results[0]["params_finite"]


def _warmup_and_resume(rank: int, world_size: int, policy_path: str, ckpt: str) -> dict[str, Any]:
    # No early look before the end of the 4-step warm-up: the warm-up is what is tested here.
    model, ddp, opt, ctl = _setup(rank, policy_path, first_look_steps=4, opening=False)
    warm_plans = []
    for step in range(5 * WINDOW):
        _train_step(ctl, ddp, opt, rank, step)
        if step < 4:
            warm_plans.append(dict(ctl.plan))
    saved_plan = dict(ctl.plan)
    path = Path(ckpt) / f"rank{rank}.pt"
    torch.save({"ac": ctl.state_dict(), "model": model.state_dict()}, path)
    events = [e.to_dict() for e in ctl.adaptive.guards.events] if ctl.adaptive else []

    model2, _, _, ctl2 = _setup(rank, policy_path, first_look_steps=4, opening=False)
    blob = torch.load(path, weights_only=False)
    model2.load_state_dict(blob["model"])
    ctl2.load_state_dict(blob["ac"])
    assert ctl.adaptive is not None and ctl2.adaptive is not None
    return {
        "warm_plans": warm_plans,
        "events": events,
        "saved_plan": saved_plan,
        "restored_plan": dict(ctl2.plan),
        "step": ctl2.step,
        "guards_equal": ctl.adaptive.guards.state_dict() == ctl2.adaptive.guards.state_dict(),
        "meter_equal": ctl.adaptive.meter.state_dict() == ctl2.adaptive.meter.state_dict(),
    }


def test_warmup_runs_accurate_options_only_and_resume_restores_the_plan(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    results = run_ranks(_warmup_and_resume, 2, tmp_path / "ranks", str(policy), str(ckpt))
    for result in results:
        # The warm-up runs the options that send the gradient almost whole, nothing else.
        warm_specs = {spec.split(":")[0] for plan in result["warm_plans"] for spec in plan.values()}
        assert warm_specs <= {"none", "fp16", "int8"}, warm_specs
        assert result["restored_plan"] == result["saved_plan"]
        assert any(spec != "none" for spec in result["saved_plan"].values())
        assert result["step"] == 5 * WINDOW
        assert result["guards_equal"] and result["meter_equal"]
    warmup = [e for e in results[0]["events"] if e["guard"] == "warmup"]
    assert len(warmup) == 1 and warmup[0]["step"] == 4


DECODE_SECONDS = 0.02


def _decode_timed(rank: int, world_size: int, policy_path: str) -> dict[str, Any]:
    """Every compressed layer's decode (in the bucket's completion callback) made 20 ms
    slower; rank 0 reports the per-layer hook seconds the planner is given."""
    import time

    import autocomp.hook

    decode = autocomp.hook.decode_into

    def slow_decode(*args: Any) -> Any:
        time.sleep(DECODE_SECONDS)
        return decode(*args)

    autocomp.hook.decode_into = slow_decode  # type: ignore[assignment]
    _model, ddp, opt, ctl = _setup(rank, policy_path, plan={"fc*.weight": "int8"})
    assert ctl.adaptive is not None
    seen: list[dict[str, tuple[str, float]]] = []
    decide = ctl.adaptive.planner.decide

    def recording(m: Any, current: Any, **kwargs: Any) -> Any:
        seen.append({n: (layer.spec, layer.hook_seconds) for n, layer in m.layers.items()})
        return decide(m, current, **kwargs)

    ctl.adaptive.planner.decide = recording  # type: ignore[method-assign]
    for step in range(4 * WINDOW):
        _train_step(ctl, ddp, opt, rank, step)
    return {"windows": seen}


def test_a_layers_measured_cost_includes_its_decode(tmp_path: Path) -> None:
    """The cost model's prior and the opening's calibration price a layer's compress and
    decode; its online samples must too, or they teach it a cost too low (the decode runs in
    the bucket's completion callback, outside the hook call)."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(_decode_timed, 2, tmp_path / "ranks", str(policy))
    compressed = [
        (name, seconds)
        for window in results[0]["windows"]
        for name, (spec, seconds) in window.items()
        if spec.startswith("int8")
    ]
    assert {name for name, _ in compressed} == {"fc1.weight", "fc2.weight", "fc3.weight"}
    # Compressing these small layers takes well under a millisecond; the decode 20 ms.
    assert all(seconds >= 0.9 * DECODE_SECONDS for _, seconds in compressed), compressed


def _contention_reread(
    rank: int,
    world_size: int,
    policy_path: str,
    opening_slowdown: float,
    later_slowdown: float,
    shares: tuple[float, float] = (1e9, 1e9),
) -> dict[str, Any]:
    """Train with the contention probe's loops scripted: each pair's loop beside the
    transfer is slowed by ``opening_slowdown`` seconds at the opening and ``later_slowdown``
    after it (the quiet loop takes 20 ms). ``shares``: each rank's
    ``CONTENTION_REREAD_SHARE`` (a huge one: a re-read is always affordable; the scripted
    loops take no time, so the probe's cost is its loopback transfers alone)."""
    import autocomp.adaptive as adaptive
    import autocomp.probe_runner as probe_runner

    adaptive.CONTENTION_REREAD_SHARE = shares[rank]

    phase = {"name": "opening"}
    loops = {"opening": 0, "boundary": 0}

    def scripted(matrix: torch.Tensor, reps: int) -> float:
        loops[phase["name"]] += 1
        if reps <= 4:  # the warm-up and the 4-product timing; the pairs' loops run 10
            return 1e-3 * reps
        pair = (loops[phase["name"]] - 3) % 2  # 0: alone, 1: beside
        slowed = opening_slowdown if phase["name"] == "opening" else later_slowdown
        return 0.020 + (slowed if pair == 1 else 0.0)

    probe_runner._compute_seconds = scripted
    model, ddp, opt, ctl = _setup(rank, policy_path, link=CRAWLING_LINK)
    assert ctl.adaptive is not None
    _train_step(ctl, ddp, opt, rank, 0)
    opened = ctl.adaptive.planner.cost_model.contention_seconds_per_byte
    phase["name"] = "boundary"
    for step in range(1, 4 * WINDOW):
        _train_step(ctl, ddp, opt, rank, step)
    from autocomp.compressors import Collective
    from autocomp.link_model import link_bytes

    payload = ctl.history[0].probe_bytes
    return {
        "opened": opened,
        "contention": ctl.adaptive.planner.cost_model.contention_seconds_per_byte,
        "sent": link_bytes(Collective.ALL_REDUCE, payload, world_size),
        "boundary_loops": loops["boundary"],
        "opening_probe_seconds": ctl.adaptive._prober.last_contention_seconds,
        "compressed": any(spec != "none" for spec in ctl.plan.values()),
        "params": _flat(model),
    }


@pytest.mark.parametrize(
    ("opening_slowdown", "later_slowdown", "rereads"),
    [
        (0.0, 0.004, 1),  # none at the opening (quiet): re-read once, the re-read stands
        (0.001, 0.004, 1),  # 5% of the quiet loop, under twice the cut: re-read, the larger
        (0.001, 0.0008, 1),  # ... and a lower re-read leaves the opening's standing
        (0.004, 0.004, 0),  # 20%: settled, never taken again
    ],
)
def test_an_unsettled_contention_reading_is_taken_again_at_a_boundary(
    opening_slowdown: float, later_slowdown: float, rereads: int, tmp_path: Path
) -> None:
    """The opening reads transfer contention in one moment; a reading of none prices every
    hidden transfer as free, and on a 2-core pair it comes from a quiet moment about one
    opening in eight (one in twelve read a slowdown of about 5%, just over the 3% cut). So
    once a layer is compressed, a reading under twice the cut is timed again at the next
    boundary on every rank, and the larger reading stands in every rank's cost model; a
    settled reading is never taken again. The ranks stay in step (identical parameters)."""
    from autocomp.probe_runner import CONTENTION_PAIRS

    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    zero, one = run_ranks(
        _contention_reread,
        2,
        tmp_path / "ranks",
        str(policy),
        opening_slowdown,
        later_slowdown,
    )
    assert torch.equal(zero["params"], one["params"])
    assert zero["compressed"] and one["compressed"]
    assert zero["opened"] == one["opened"] == pytest.approx(opening_slowdown / zero["sent"])
    stands = max(opening_slowdown, later_slowdown) if rereads else opening_slowdown
    assert zero["contention"] == one["contention"] == pytest.approx(stands / zero["sent"])
    # Each re-read of one batch (it read contention): its two timing loops and its pairs.
    expected_loops = rereads * (2 + 2 * CONTENTION_PAIRS)
    assert zero["boundary_loops"] == one["boundary_loops"] == expected_loops


@pytest.mark.parametrize(("shares", "rereads"), [((0.0, 0.0), 0), ((1e9, 0.0), 1), ((0.0, 1e9), 0)])
def test_a_contention_reread_waits_until_rank_0_finds_it_affordable(
    shares: tuple[float, float], rereads: int, tmp_path: Path
) -> None:
    """A re-read costs about a second on a slow link, so it waits until its cost is a small
    share of the run (``CONTENTION_REREAD_SHARE``). The share is judged on rank 0 alone and
    travels in its plan broadcast: with a share of 0 there (never affordable) nobody re-reads,
    whatever the other rank's share, and with a huge one every rank re-reads at the same
    boundary, its own share notwithstanding; the ranks stay in step either way."""
    from autocomp.probe_runner import CONTENTION_PAIRS

    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    zero, one = run_ranks(
        _contention_reread, 2, tmp_path / "ranks", str(policy), 0.0, 0.004, shares
    )
    assert torch.equal(zero["params"], one["params"])
    assert zero["compressed"] and one["compressed"]
    assert zero["boundary_loops"] == one["boundary_loops"] == rereads * (2 + 2 * CONTENTION_PAIRS)
    expected = 0.004 / zero["sent"] if rereads else 0.0  # the opening read none
    assert zero["contention"] == one["contention"] == pytest.approx(expected)
    assert zero["opening_probe_seconds"] is not None and zero["opening_probe_seconds"] > 0


def _bad_arguments(rank: int, world_size: int) -> dict[str, str]:
    cases = {
        "overlap": {"target_overlap": 1.5},
        "overlap_type": {"target_overlap": "high"},
        "window": {"window": 0},
        "warmup": {"warmup_steps": -1},
        "policy": {"policy": "no-such-preset"},
    }
    out = {}
    for key, kwargs in cases.items():
        try:
            autocomp.wrap(DDP(MultiBucketNet()), **kwargs)
            out[key] = "no error"
        except Exception as err:  # the test inspects type and message
            out[key] = f"{type(err).__name__}: {err}"
    return out


def test_adaptive_arguments_are_validated(tmp_path: Path) -> None:
    (out,) = run_ranks(_bad_arguments, 1, tmp_path)
    assert out["overlap"].startswith("ValueError") and "[0, 1]" in out["overlap"]
    assert out["overlap_type"].startswith("TypeError")
    assert out["window"].startswith("ValueError") and "window" in out["window"]
    assert out["warmup"].startswith("ValueError")
    assert out["policy"].startswith("ValueError") and "default" in out["policy"]


def _large_calibration(rank: int, world_size: int) -> dict[str, Any]:
    """Wrap a model whose largest matrix has 2M elements; rank 0's calibration points."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 1024), torch.nn.Linear(1024, 8))
    ctl = autocomp.wrap(DDP(model), target_overlap=0.9)
    points = ctl.adaptive.planner.cost_model._prior_scale["fp16"]
    ctl.close()
    return {"sizes": [numel for numel, _ in points]}


def test_the_calibration_also_times_the_largest_matrix(tmp_path: Path) -> None:
    """At wrap, rank 0 times the candidates on 1M elements and on the model's largest
    matrix (2048 x 1024 here), so the cost model prices fp16 by size."""
    (out,) = run_ranks(_large_calibration, 1, tmp_path)
    assert out["sizes"] == [1024 * 1024, 2048 * 1024]


class _TokenBag(torch.nn.Module):
    """An embedding bag and a linear head: each step's gradient touches at most 32 of the
    table's 4096 rows (0.8% of its elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(4096, 32)
        self.head = torch.nn.Linear(32, 5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(tokens).mean(dim=1))


def _row_sparse(rank: int, world_size: int, policy_path: str) -> dict[str, Any]:
    torch.manual_seed(0)
    ddp = DDP(_TokenBag())
    config = autocomp.AutocompConfig(target_overlap=0.9, policy=policy_path, window=WINDOW)
    ctl = autocomp.wrap(ddp, config=config)
    assert ctl.adaptive is not None
    if rank == 0:
        ctl.adaptive.meter.end_window = lambda **_: SLOW_LINK  # type: ignore[method-assign]
        ctl.adaptive.payoff.hold_reason = lambda *_: None  # type: ignore[method-assign]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    rows = set()
    for step in range(5 * WINDOW):
        gen = torch.Generator().manual_seed(1000 * rank + step)
        tokens = torch.randint(0, 4096, (8, 4), generator=gen)
        rows |= {(step, int(t)) for t in tokens.reshape(-1)}
        if step == 0:
            first_rows = len(torch.unique(tokens))
        loss = torch.nn.functional.cross_entropy(ddp(tokens), tokens[:, 0] % 5)
        opt.zero_grad()
        loss.backward()
        opt.step()
    # The boundary that moved the table to top-1% priced it before any top-k measurement on
    # it: from the share alone. (Later windows measure it in use, where the residual the
    # earlier compressor left behind shows for a while: 0.03-0.22 seen.)
    moved = [
        r for r in ctl.history if r.changes.get("table.weight", ("", ""))[1].startswith("topk")
    ]
    table_error = None
    if moved and moved[0].decision is not None:
        (table_error,) = [
            layer["predicted_error"]
            for layer in moved[0].decision["layers"]
            if layer["name"] == "table.weight"
        ]
    return {
        "share": ctl.adaptive.planner.nonzero_shares.get("table.weight"),
        "head_share": ctl.adaptive.planner.nonzero_shares.get("head.weight"),
        "rows_per_step": len(rows) / (5 * WINDOW),
        "first_rows": first_rows,
        "row_share": ctl.adaptive.planner.row_shares.get("table.weight"),
        "plan": dict(ctl.plan),
        "table_error": table_error,
        "grad_l1": dict(ctl.adaptive.planner.grad_l1s),
        "grad_norm": dict(ctl.adaptive.planner.grad_norms),
    }


def test_an_embedding_tables_nonzero_share_reaches_the_policy(tmp_path: Path) -> None:
    """The hook samples each gradient's nonzero share (and L1 norm), the window carries it to
    rank 0 and the planner hands it to the engine: an embedding table whose steps touch 0.8%
    of its rows is seen as such (the head as dense), and the switch to top-1% prices it at
    no error, as it sends every nonzero. Before any gradient, the opening has the share of
    rows the first forward looked up."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace('"topk:ratio=0.1"', '"topk:ratio=0.01"'))
    results = run_ranks(_row_sparse, 2, tmp_path / "ranks", str(policy))
    out = results[0]
    true_share = out["rows_per_step"] / 4096
    assert out["share"] == pytest.approx(true_share, rel=0.1), out
    # The opening had the first forward's rows (``EmbeddingRows``), each rank its own.
    assert out["row_share"] == out["first_rows"] / 4096
    assert results[1]["row_share"] == results[1]["first_rows"] / 4096
    assert out["head_share"] == pytest.approx(1.0)
    assert out["plan"]["table.weight"].startswith("topk:ratio=0.01"), out
    assert out["table_error"] == 0.0
    assert results[1]["plan"] == out["plan"]
    # The measured L1 norms reach the planner too: between the L2 norm and sqrt(nonzero
    # elements) x it (a step's 32 rows of 32 on the table, 5 x 32 on the head).
    l1, l2 = out["grad_l1"], out["grad_norm"]
    assert set(l1) == set(l2) == {"table.weight", "head.weight", "head.bias"}
    assert 0.9 * l2["table.weight"] < l1["table.weight"] <= 32 * l2["table.weight"]
    assert 0.9 * l2["head.weight"] < l1["head.weight"] <= 160**0.5 * l2["head.weight"]
