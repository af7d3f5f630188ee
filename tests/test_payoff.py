"""Tier 1: the payoff check (pure unit, no processes).

A compressed window is compared with the latest uncompressed one on a similar link; no
``min_gain`` speed-up starts a hold, which ends after ``hold_windows`` or when the link
estimate moves by ``link_change``. The engine then leaves the optimizer's layers
uncompressed with the hold's reason, pins untouched. Between compressed plans, the ledger
sends the planner back to a plan measured clearly faster (medians over the slack, ranges
apart), never on a few windows' noise or fewer than ``ledger_windows`` windows. A run that
compressed from its first steps measures an uncompressed baseline once, when its plan was
predicted to save under ``baseline_gain`` of the step. A plan that paid, or one that measured
faster than the baseline, and then misses the bar once has the baseline measured again before
a second miss holds. The plan's side is the median of its current stretch of settled windows,
and a lossless plan (fp16) needs only ``lossless_min_gain``.
"""

from __future__ import annotations

import pytest
import torch

from autocomp.policy import LayerProfile, PolicyEngine, PolicyRules, StepTiming
from autocomp.policy.payoff import (
    BASELINE_SETTLE_STEPS,
    LOSSLESS_REQUIRED_GAIN,
    PayoffCheck,
    gain_bar,
)

GBIT = 1e9 / 8


def test_a_compressed_window_that_is_not_faster_starts_a_hold() -> None:
    check = PayoffCheck()
    assert check.observe(1, compressed=False, step_seconds=0.220, bandwidth=8 * GBIT) is None
    note = check.observe(2, compressed=True, step_seconds=0.215, bandwidth=7 * GBIT)
    # No plan named (no stretch, no second look); no error priced: the lossless bar, 3%.
    assert note is not None and "gain 2.3% < 3.0% (min_gain 5%, 3% for a lossless plan" in note
    assert check.holds == 1 and check.last_gain == pytest.approx(1 - 0.215 / 0.220)
    reason = check.hold_reason(3, 8 * GBIT)
    assert reason is not None and "held off until window 12" in reason
    assert check.hold_reason(11, 8 * GBIT) is not None
    assert check.hold_reason(12, 8 * GBIT) is None  # expired: the engine may try again
    assert check.hold_reason(13, 8 * GBIT) is None


def test_a_plan_must_measure_the_gain_its_error_costs() -> None:
    """A window 7% faster passes ``min_gain`` (5%) but not the 20% of per-step progress the
    engine said the plan's error costs (``PolicyDecision.required_gain``): held. A plan that
    costs little (fp16: required ~0) needs only ``min_gain``."""
    check = PayoffCheck()
    check.observe(1, compressed=False, step_seconds=0.0505, bandwidth=8 * GBIT)
    assert check.observe(2, True, 0.047, 8 * GBIT, required_gain=0.0) is None
    note = check.observe(3, True, 0.047, 8 * GBIT, required_gain=0.2)
    assert note is not None and "gain 6.9% < 20.0%" in note
    assert check.hold_reason(4, 8 * GBIT) is not None
    assert check.last_gain == pytest.approx(1 - 0.047 / 0.0505)


def test_an_idle_link_probe_tells_the_plans_traffic_from_a_link_change() -> None:
    """Compressed, the MLP LM's loopback estimate fell from 7 to 2 Gbit/s: its own small
    transfers, not the link. With a reference probe taken while uncompressed, the check asks
    for a probe of the same size; one that reads the same link compares the window with the
    baseline after all (held: 1% faster, 17% needed), and the hold keeps the baseline's link,
    so the uncompressed windows that follow do not end it. A probe that reads a slower link
    voids the comparison as before."""
    for probe_rate, held in ((6.5 * GBIT, True), (2.0 * GBIT, False)):
        check = PayoffCheck()
        assert check.probe_wanted() == 0
        check.note_probe(13_714_432, 6.8 * GBIT, compressed=False)  # the opening's
        check.note_probe(1_000, 0.1 * GBIT, compressed=True)  # not a reference
        check.observe(2, compressed=False, step_seconds=0.0487, bandwidth=7 * GBIT)
        assert check.observe(3, True, 0.0482, 2 * GBIT, required_gain=0.17) is None
        assert check.last_gain is None and check.probe_wanted() == 13_714_432
        assert check.probe_wanted() == 0  # asked once
        note = check.observe(
            4, True, 0.0482, 2 * GBIT, required_gain=0.17, probe_bytes_per_s=probe_rate
        )
        assert (note is not None) is held
        if held:
            assert check.last_gain == pytest.approx(1 - 0.0482 / 0.0487)
            assert check.hold_reason(4, 2 * GBIT) is not None  # judged on this estimate
            assert check.hold_reason(5, 7 * GBIT) is not None  # the baseline's link
            restored = PayoffCheck()
            restored.load_state_dict(check.state_dict())
            assert restored.hold_reason(6, 7 * GBIT) is not None
            assert restored._reference_probe == (13_714_432, 6.8 * GBIT)
        else:
            assert check.last_gain is None and check.hold_reason(5, 2 * GBIT) is None


def test_without_a_reference_probe_a_moved_estimate_voids_the_comparison() -> None:
    check = PayoffCheck()
    check.observe(2, compressed=False, step_seconds=0.0487, bandwidth=7 * GBIT)
    assert check.observe(3, True, 0.0482, 2 * GBIT, required_gain=0.17) is None
    assert check.probe_wanted() == 0 and check.last_gain is None


def test_a_link_change_ends_a_hold_and_voids_the_baseline() -> None:
    check = PayoffCheck()
    check.observe(1, False, 0.22, 8 * GBIT)
    assert check.observe(2, True, 0.23, 8 * GBIT) is not None
    assert check.hold_reason(3, 3 * GBIT) is None  # the link dropped by more than 2x
    # The baseline was measured on the old link: a compressed window on the new one is not
    # compared with it (no hold however slow), until an uncompressed window there.
    assert check.observe(4, True, 0.5, 3 * GBIT) is None and check.last_gain is None
    check.observe(5, False, 0.6, 3 * GBIT)
    assert check.observe(6, True, 0.3, 3 * GBIT) is None
    assert check.last_gain == pytest.approx(0.5)


def test_paying_compression_is_never_held_and_state_round_trips() -> None:
    check = PayoffCheck(PayoffCheck.Config(min_gain=0.1, hold_windows=3))
    check.observe(1, False, 3.0, 0.2 * GBIT)
    assert check.observe(2, True, 0.3, 0.2 * GBIT) is None
    assert check.hold_reason(3, 0.2 * GBIT) is None
    assert check.observe(3, True, 2.9, 0.2 * GBIT, required_gain=0.01) is not None  # 3% < 10%
    restored = PayoffCheck(PayoffCheck.Config(min_gain=0.1, hold_windows=3))
    restored.load_state_dict(check.state_dict())
    assert restored.holds == 1
    assert restored.hold_reason(4, 0.2 * GBIT) == check.hold_reason(4, 0.2 * GBIT)
    assert restored.hold_reason(4, 0.2 * GBIT) is not None


def test_missing_inputs_and_bad_config() -> None:
    check = PayoffCheck()
    assert check.observe(1, False, 0.2, None) is None
    assert check.observe(2, True, 0.3, 1 * GBIT) is None  # no baseline yet
    assert check.observe(3, True, float("nan"), 1 * GBIT) is None
    for bad in (
        {"min_gain": 1.0},
        {"hold_windows": 0},
        {"link_change": 1.0},
        {"revert_slack": 1.0},
        {"ledger_windows": 0},
        {"ledger_plans": 1},
    ):
        with pytest.raises(ValueError):
            PayoffCheck.Config(**bad)  # type: ignore[arg-type]


class _Link:
    """A 50 Mbit/s link: every big layer would be compressed."""

    bandwidth_bytes_per_s = 50e6 / 8

    def comm_seconds(self, collective: object, payload_bytes: int, world_size: int) -> float:
        return 1e-4 + payload_bytes / self.bandwidth_bytes_per_s

    def compress_seconds(
        self, compressor: object, shape: torch.Size, nonzero_share: float = 1.0
    ) -> float:
        return 1e-3

    def contention_rate(self) -> float:
        return 0.0

    def half_sum_seconds_per_element(self, dtype: torch.dtype) -> float:
        return 0.0


def test_engine_leaves_the_optimizer_layers_uncompressed_while_held() -> None:
    rules = PolicyRules(warmup_steps=0, pins=(), candidates=("none", "fp16", "powersgd:rank=4"))
    engine = PolicyEngine(rules, _Link(), target_overlap=0.9)
    layers = [
        LayerProfile(name="a.weight", shape=(1024, 1024), grad_norm=1.0),
        LayerProfile(name="b.weight", shape=(1024, 1024), grad_norm=1.0),
    ]
    timing = StepTiming(backward_seconds=0.1, hideable_seconds=0.08, step_seconds=0.3)
    free = engine.decide(layers, timing, 100, 2)
    assert all(d.spec != "none" for d in free.layers)
    held = engine.decide(
        layers, timing, 100, 2, hold_reason="measured no payoff", pins=[("b.*", "fp16")]
    )
    assert held.layer("a.weight").spec == "none"
    assert held.layer("a.weight").rule == "no_gain"
    assert held.layer("a.weight").reason == "measured no payoff"
    assert held.layer("b.weight").spec == "fp16:ef=true"  # a pin is not the optimizer's
    assert held.solver == "held"
    # The prediction covers the held layers' uncompressed communication too.
    none_only = PolicyEngine(
        PolicyRules(warmup_steps=0, candidates=("none",)), _Link(), target_overlap=0.9
    ).decide(layers, timing, 100, 2, pins=[("b.*", "fp16")])
    assert held.predicted_comm_seconds == pytest.approx(none_only.predicted_comm_seconds)
    assert held.predicted_exposed_seconds == pytest.approx(none_only.predicted_exposed_seconds)
    assert held.predicted_exposed_seconds > 0


FAST = ("powersgd:rank=4", "powersgd:rank=4")
SLOW = ("powersgd:rank=16", "int8")


def _settle(check: PayoffCheck, first: int, plan: tuple[str, ...], steps: list[float]) -> list:
    """Settled compressed windows of ``plan`` from window ``first`` on; the notes."""
    return [check.observe(first + i, True, step, 50e6 / 8, plan) for i, step in enumerate(steps)]


def test_a_plan_measured_clearly_slower_than_another_is_reverted() -> None:
    """The GPT LM at 50 Mbit/s: all-rank-4 ran at 177 ms/step, the plan the engine moved to
    (within its 3% predicted slack) at 180-190 ms."""
    check = PayoffCheck()
    assert _settle(check, 1, FAST, [0.176, 0.177, 0.178, 0.177]) == [None] * 4
    notes = _settle(check, 6, SLOW, [0.185, 0.181, 0.189, 0.184])
    assert notes[:3] == [None] * 3  # fewer than ledger_windows: not judged yet
    assert notes[3] is not None and "4.2% slower than the plan of window 4" in notes[3]
    assert check.reverts == 1
    assert check.revert_plan(10, 50e6 / 8) == FAST
    assert check.revert_plan(18, 50e6 / 8) == FAST
    assert check.revert_plan(19, 50e6 / 8) is None  # hold_windows (10) after window 9
    # Back on the slow plan after the revert: its old windows count, one more is enough.
    assert _settle(check, 20, SLOW, [0.186]) != [None] and check.reverts == 2


def test_noise_or_a_link_change_never_reverts() -> None:
    # Medians 4% apart, but the windows overlap: noise, not a slower plan.
    check = PayoffCheck()
    _settle(check, 1, FAST, [0.170, 0.185, 0.176, 0.180])
    assert _settle(check, 6, SLOW, [0.181, 0.190, 0.183, 0.189]) == [None] * 4
    assert check.revert_plan(10, 50e6 / 8) is None and check.reverts == 0
    # Within the slack (2%), even fully separated.
    close = PayoffCheck()
    _settle(close, 1, FAST, [0.176, 0.177, 0.177, 0.177])
    assert _settle(close, 6, SLOW, [0.180, 0.180, 0.181, 0.181]) == [None] * 4
    # A revert ends when the link moves 2x; plans from the old link leave the ledger.
    moved = PayoffCheck()
    _settle(moved, 1, FAST, [0.176, 0.177, 0.178, 0.177])
    assert _settle(moved, 6, SLOW, [0.185, 0.186, 0.189, 0.184])[3] is not None
    assert moved.revert_plan(10, 200e6 / 8) is None
    assert moved.observe(11, True, 0.3, 200e6 / 8, SLOW) is None


def test_the_planner_sends_the_engine_back_to_the_faster_plan() -> None:
    """The ledger's plan reaches the engine as locks: the layers return to it."""
    from tests.test_planner import NAMES, measurement, planner

    wide = planner(warmup_steps=0)
    rank4 = {"fc1.weight": "powersgd:rank=4,ef=true", "fc1.bias": "none"}
    rank4["fc2.weight"] = "powersgd:rank=4,ef=true"
    slower = {**rank4, "fc2.weight": "powersgd:rank=16,ef=true"}
    for i, step in enumerate([0.176, 0.177, 0.178, 0.177]):
        wide.payoff.observe(i, True, step, 50e6 / 8, tuple(rank4[n] for n in NAMES))
    for i, step in enumerate([0.185, 0.186, 0.189, 0.184]):
        wide.payoff.observe(5 + i, True, step, 50e6 / 8, tuple(slower[n] for n in NAMES))
    assert wide.payoff.reverts == 1
    update = wide.decide(measurement(90, mbit=50, specs=slower), slower)
    assert dict(zip(NAMES, update.plan, strict=True)) == rank4


def test_revert_state_survives_a_checkpoint() -> None:
    check = PayoffCheck(PayoffCheck.Config(hold_windows=3))
    _settle(check, 1, FAST, [0.176, 0.177, 0.178, 0.177])
    _settle(check, 6, SLOW, [0.185, 0.186, 0.189, 0.184])
    restored = PayoffCheck(PayoffCheck.Config(hold_windows=3))
    restored.load_state_dict(check.state_dict())
    assert restored.reverts == 1 and restored.revert_plan(10, 50e6 / 8) == FAST
    assert restored.state_dict() == check.state_dict()


def test_a_failed_retry_on_the_same_link_holds_twice_as_long() -> None:
    """Each try after a hold costs compressed windows: a hold that expired and is followed by
    another on the same link lasts twice as long (10, 20, 40, 80, then 80 windows); a paying
    window or a link move starts over at ``hold_windows``."""
    check = PayoffCheck()
    check.observe(0, compressed=False, step_seconds=0.05, bandwidth=7 * GBIT)
    window, lengths = 1, []
    for _ in range(5):
        assert check.observe(window, True, 0.049, 7 * GBIT) is not None
        start = window
        while check.hold_reason(window, 7 * GBIT) is not None:
            window += 1
        lengths.append(window - start)
    assert lengths == [10, 20, 40, 80, 80]
    assert check.observe(window, True, 0.03, 7 * GBIT) is None  # pays: back to 10
    assert check.observe(window + 1, True, 0.049, 7 * GBIT) is not None
    assert check.hold_reason(window + 11, 7 * GBIT) is None
    restored = PayoffCheck()
    restored.load_state_dict(check.state_dict())
    assert restored.state_dict() == check.state_dict()


def test_the_first_window_after_a_switch_asks_for_the_probe() -> None:
    check = PayoffCheck()
    check.observe(1, compressed=False, step_seconds=0.0487, bandwidth=7 * GBIT)
    check.watch(6.5 * GBIT)  # the estimate has not moved: nothing to tell apart
    assert check.probe_wanted() == 0
    check.watch(2 * GBIT)
    assert check.probe_wanted() == 0  # no reference probe: no probe can settle it
    check.note_probe(4_000_000, 6.8 * GBIT, compressed=False)
    check.watch(2 * GBIT)
    assert check.probe_wanted() == 4_000_000


MBYTE = 1e6


def test_a_run_compressed_from_the_start_measures_a_baseline_once() -> None:
    """The digits ResNet at 200 Mbit/s compressed from step 1, predicted 21% faster than
    uncompressed, and measured 1.11x plain DDP's step: with no uncompressed window the check
    never fired. Now the first settled compressed window seeks a baseline (two windows
    uncompressed), and the compressed plan after it is judged against that baseline."""
    check = PayoffCheck()
    note = check.observe(2, True, 0.0207, 19 * MBYTE, predicted_gain=0.21)
    assert note is not None and "predicted to save only 21.0%" in note
    assert check.baseline_sought and check.holds == 0
    assert not check.seeking_baseline() and check.baseline_window_steps() == 0
    # Two decisions hold the layers uncompressed; their windows are short: the first takes
    # the switch, the second is measured (both at window index 2: a short window does not
    # move the step-based index).
    steps = []
    for _ in range(2):
        reason = check.hold_reason(2, 19 * MBYTE)
        assert reason is not None and "measuring an uncompressed baseline" in reason
        assert check.seeking_baseline()
        steps.append(check.baseline_window_steps())
    assert steps == [BASELINE_SETTLE_STEPS, check.config.baseline_steps]
    # The first short window ran uncompressed after the switch (not settled); the second is
    # the baseline.
    assert check.observe(2, False, 0.0185, 24 * MBYTE) is None
    assert check.hold_reason(2, 19 * MBYTE) is None and not check.seeking_baseline()
    assert check.baseline_window_steps() == 0
    # The compressed plan again: its settled window is judged against the baseline.
    held = check.observe(6, True, 0.0207, 19 * MBYTE, predicted_gain=0.21)
    assert held is not None and "no payoff" in held and check.holds == 1
    assert check.last_gain == pytest.approx(1 - 0.0207 / 0.0185)
    # baseline_steps 0: the baseline's windows are regular ones.
    regular = PayoffCheck(PayoffCheck.Config(baseline_steps=0))
    regular.observe(2, True, 0.0207, 19 * MBYTE, predicted_gain=0.21)
    assert regular.hold_reason(2, 19 * MBYTE) is not None
    assert regular.seeking_baseline() and regular.baseline_window_steps() == 0


def test_a_baseline_is_sought_only_for_a_small_predicted_gain_and_only_once() -> None:
    check = PayoffCheck()
    # A slow link's plan (predicted 4x faster): measuring uncompressed would cost too much.
    assert check.observe(2, True, 0.1, 2 * MBYTE, predicted_gain=0.75) is None
    assert check.observe(3, True, 0.1, 2 * MBYTE, predicted_gain=None) is None
    assert not check.baseline_sought and check.hold_reason(4, 2 * MBYTE) is None
    assert check.observe(4, True, 0.1, 2 * MBYTE, predicted_gain=0.1) is not None
    assert check.hold_reason(4, 2 * MBYTE) is not None
    assert check.hold_reason(4, 2 * MBYTE) is not None
    assert check.hold_reason(4, 2 * MBYTE) is None
    # The baseline windows never measured (e.g. a quiet stretch skipped them): not again.
    assert check.observe(7, True, 0.1, 2 * MBYTE, predicted_gain=0.1) is None
    assert check.hold_reason(8, 2 * MBYTE) is None
    off = PayoffCheck(PayoffCheck.Config(baseline_gain=0.0))
    assert off.observe(2, True, 0.1, 2 * MBYTE, predicted_gain=0.01) is None


def test_a_sought_baseline_survives_a_checkpoint() -> None:
    check = PayoffCheck()
    check.observe(2, True, 0.02, 19 * MBYTE, predicted_gain=0.2)
    restored = PayoffCheck()
    restored.load_state_dict(check.state_dict())
    assert restored.state_dict() == check.state_dict()
    assert restored.baseline_sought and not restored.seeking_baseline()
    assert restored.hold_reason(2, 19 * MBYTE) is not None
    assert restored.baseline_window_steps() == BASELINE_SETTLE_STEPS
    again = PayoffCheck()
    again.load_state_dict(restored.state_dict())
    assert again.seeking_baseline() and again.baseline_window_steps() == BASELINE_SETTLE_STEPS
    assert again.hold_reason(2, 19 * MBYTE) is not None
    assert again.hold_reason(2, 19 * MBYTE) is None
    assert restored.observe(5, True, 0.02, 19 * MBYTE, predicted_gain=0.2) is None


@pytest.mark.parametrize(
    "kwargs", [{"baseline_gain": 1.0}, {"baseline_windows": 1}, {"baseline_steps": 1}]
)
def test_bad_baseline_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PayoffCheck.Config(**kwargs)  # type: ignore[arg-type]


def test_the_min_gain_floor_applies_after_a_hold_until_a_plan_measures_its_gain() -> None:
    """``compression_measured``: every plan counts as measured until a compressed plan has
    measured no payoff (a hold; before that, the engine's predictions stand); after it, only
    a compressed plan whose settled window measured at least its bar faster than the
    baseline."""
    paying, slow, other = ("fp16", "none"), ("powersgd:rank=4", "none"), ("int8", "none")
    check = PayoffCheck()
    assert check.observe(1, True, 0.040, 8 * GBIT, paying) is None  # no baseline yet
    assert check.compression_measured(paying) and check.compression_measured(slow)
    check.observe(2, False, 0.050, 8 * GBIT, ("none", "none"))
    assert check.observe(3, True, 0.040, 8 * GBIT, paying) is None  # 20% faster
    assert check.compression_measured(slow)  # no hold yet
    assert check.observe(4, True, 0.052, 8 * GBIT, slow) is not None  # slower: held
    assert check.compression_measured(paying)
    assert not check.compression_measured(slow) and not check.compression_measured(other)
    restored = PayoffCheck()
    restored.load_state_dict(check.state_dict())
    assert restored.compression_measured(paying) and not restored.compression_measured(slow)


def test_a_plan_that_paid_measures_the_baseline_again_before_a_hold() -> None:
    """The GPT LM at 1 Gbit/s (120 s, thirty-fifth session): fp16 everywhere paid 11% (0.153
    s a step against 0.172 uncompressed), then a window on a machine that had slowed down
    missed the bar against the old baseline, and the hold kept the run uncompressed for its
    last 470 steps. A plan that paid has the uncompressed step measured again (the short
    baseline windows) and is judged against that; only a miss against the new baseline
    holds. The plan's side is the median of its stretch: 0.153 and 0.190 read 0.1715."""
    fp16, none = ("fp16", "fp16"), ("none", "none")
    check = PayoffCheck()
    check.observe(2, False, 0.172, GBIT, none)
    assert check.observe(3, True, 0.153, GBIT, fp16) is None  # 11%: paid
    note = check.observe(4, True, 0.190, GBIT, fp16)
    assert note is not None and "measured again before the plan is judged" in note
    assert "a plan that paid on this link measured 172 ms/step (median of 2 windows)" in note
    assert "gain 0.3% < 3.0%" in note
    assert check.holds == 0 and check.rechecks == 1
    assert check.compression_measured(fp16)  # no floor: it paid, and may pay again
    restored = PayoffCheck()
    restored.load_state_dict(check.state_dict())
    assert restored.state_dict() == check.state_dict()
    for payoff in (check, restored):
        steps = []
        for _ in range(2):
            reason = payoff.hold_reason(4, GBIT)
            assert reason is not None and "missed the bar by less than the noise" in reason
            steps.append(payoff.baseline_window_steps())
        assert steps == [BASELINE_SETTLE_STEPS, payoff.config.baseline_steps]
        assert payoff.hold_reason(4, GBIT) is None
        # The machine's new uncompressed step, and the plan judged against it on a new
        # stretch (the baseline windows ended the old one): it pays.
        assert payoff.observe(4, False, 0.185, GBIT, none) is None
        assert payoff.observe(6, True, 0.166, GBIT, fp16) is None
        assert payoff.last_gain == pytest.approx(1 - 0.166 / 0.185)
    # Once more a miss after a pass: measured again; a second miss in a row holds.
    assert check.observe(7, True, 0.200, GBIT, fp16) is not None and check.rechecks == 2
    assert check.hold_reason(7, GBIT) is not None and check.hold_reason(7, GBIT) is not None
    assert check.observe(7, False, 0.181, GBIT, none) is None
    held = check.observe(9, True, 0.178, GBIT, fp16)
    assert held is not None and "compression measured no payoff" in held
    assert check.holds == 1 and check.rechecks == 2
    assert not check.compression_measured(fp16)
    reason = check.hold_reason(10, GBIT)
    assert reason is not None and "held off until window 19" in reason


def test_a_miss_within_the_noise_is_measured_again_and_a_slower_plan_holds() -> None:
    """The digits ViT at 500 Mbit/s (fifty-first session, seed 1): fp16 measured 79.8 ms a
    step against a 16-step baseline of 81.2 ms, 1.7%, and was held for the rest of the run,
    while the uncompressed windows after it read 83-98 ms. A plan that never paid but
    measured faster than the baseline now has the baseline measured again first; one that
    measured slower than the baseline holds at once."""
    fp16, none = ("fp16", "none"), ("none", "none")
    check = PayoffCheck()
    check.observe(4, False, 0.0812, 70 * MBYTE, none)
    note = check.observe(6, True, 0.0798, 70 * MBYTE, fp16, required_gain=1e-8)
    assert note is not None and "a plan faster than uncompressed measured 80 ms/step" in note
    assert check.holds == 0 and check.rechecks == 1
    assert check.hold_reason(6, 70 * MBYTE) is not None  # the two baseline windows
    assert check.hold_reason(6, 70 * MBYTE) is not None
    assert check.hold_reason(6, 70 * MBYTE) is None
    assert check.observe(6, False, 0.0863, 70 * MBYTE, none) is None
    assert check.observe(8, True, 0.0798, 70 * MBYTE, fp16, required_gain=1e-8) is None
    assert check.last_gain == pytest.approx(1 - 0.0798 / 0.0863)
    assert check.compression_measured(fp16)
    slower = PayoffCheck()
    slower.observe(4, False, 0.0812, 70 * MBYTE, none)
    held = slower.observe(6, True, 0.0850, 70 * MBYTE, fp16, required_gain=1e-8)
    assert held is not None and "compression measured no payoff" in held
    assert slower.holds == 1 and slower.rechecks == 0


def test_a_lossless_plan_clears_the_lower_bar() -> None:
    """A plan whose error the engine prices under ``LOSSLESS_REQUIRED_GAIN`` of a step's
    progress (fp16: about 1e-8) needs ``lossless_min_gain`` (3%); any other needs
    ``min_gain`` (5%) or the progress its error costs, whichever is larger."""
    assert gain_bar(1e-8, 0.05, 0.03) == 0.03
    assert gain_bar(LOSSLESS_REQUIRED_GAIN, 0.05, 0.03) == 0.05
    assert gain_bar(0.0024, 0.05, 0.03) == 0.05  # one matrix on rank 4 among fp16 ones
    assert gain_bar(0.2, 0.05, 0.03) == 0.2
    fp16, rank4, none = ("fp16", "fp16"), ("powersgd:rank=4", "fp16"), ("none", "none")
    check = PayoffCheck()
    check.observe(1, False, 0.100, GBIT, none)
    assert check.observe(2, True, 0.096, GBIT, fp16, required_gain=1e-8) is None  # 4% >= 3%
    lossy = PayoffCheck()
    lossy.observe(1, False, 0.100, GBIT, none)
    note = lossy.observe(2, True, 0.096, GBIT, rank4, required_gain=0.0024)
    assert note is not None and "gain 4.0% < 5.0%" in note and lossy.rechecks == 1
    rules = PolicyRules()
    assert rules.lossless_min_gain == min(rules.time_slack, rules.min_gain) == 0.03
    with pytest.raises(ValueError, match="lossless_min_gain"):
        PayoffCheck.Config(min_gain=0.02, lossless_min_gain=0.03)


def test_the_plans_side_is_the_median_of_its_stretch() -> None:
    """One slow window of a plan that measured fast before it does not decide alone: the
    plan's settled windows since it last started are pooled (median, the latest
    ``ledger_windows``). An uncompressed window or another plan starts a new stretch, and
    the stretch survives a checkpoint."""
    fp16, other, none = ("fp16", "none"), ("bf16", "none"), ("none", "none")
    check = PayoffCheck()
    check.observe(1, False, 0.090, GBIT, none)
    assert check.observe(2, True, 0.080, GBIT, fp16) is None
    assert check.observe(3, True, 0.083, GBIT, fp16) is None
    assert check.observe(4, True, 0.095, GBIT, fp16) is None  # alone: 5.6% slower
    assert check.last_gain == pytest.approx(1 - 0.083 / 0.090)
    for step_seconds in (0.095, 0.096, 0.097):  # only the latest four count
        check.observe(5, True, step_seconds, GBIT, fp16)
    assert check.last_gain == pytest.approx(1 - 0.0955 / 0.090)
    restored = PayoffCheck()
    restored.load_state_dict(check.state_dict())
    assert restored.state_dict() == check.state_dict()
    fresh = PayoffCheck()
    fresh.observe(1, False, 0.090, GBIT, none)
    fresh.observe(2, True, 0.080, GBIT, fp16)
    fresh.observe(3, True, 0.086, GBIT, other)  # another plan: its own stretch
    assert fresh.last_gain == pytest.approx(1 - 0.086 / 0.090)
    fresh.observe(4, False, 0.090, GBIT, none)
    fresh.observe(5, True, 0.087, GBIT, other)  # after an uncompressed window: alone
    assert fresh.last_gain == pytest.approx(1 - 0.087 / 0.090)
