"""Tier 1: pure unit, no processes.

Each test injects one fault into :class:`autocomp.guards.ConvergenceGuards` and checks the
reaction the controller will apply:

- a NaN gradient in one layer: that layer (only) is queued for an error-feedback reset, an
  event is recorded and the step is marked uncompressed;
- a sustained loss rise after warm-up backs off every layer one level, and quiet windows bring
  it back to 0; a single noisy spike does not fire (patience + rising trend);
- a gradient-norm jump in one layer (Accordion critical regime) that persists for
  ``critical_patience`` windows backs off that layer only, by one level while the regime
  lasts, lifted by the first calm interval (or, with a hold, the first after the hold); a
  single noisy window does not fire, and
  all layers moving by one power of two at once (GradScaler changing its loss scale) rescales
  the references instead of backing anything off;
- a residual norm beyond ``residual_factor`` x the gradient norm resets and backs off;
- back-off levels are clamped at ``max_backoff``; the warm-up event is recorded once; the
  event buffer is bounded and counts what it dropped; ``state_dict`` survives a JSON round trip
  and the restored guards make identical decisions; non-finite losses are ignored with an
  event;
- the torch helpers (``layer_norms``, ``nonfinite_layers``) feed the guards from real tensors.
"""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from autocomp.guard_events import GUARD_NAMES, GuardEvent
from autocomp.guard_inputs import layer_norms, nonfinite_layers, nonfinite_mask
from autocomp.guards import ConvergenceGuards

LAYERS = ["fc1.weight", "fc1.bias", "fc2.weight"]
CALM = {"fc1.weight": 1.0, "fc1.bias": 0.1, "fc2.weight": 2.0}
NO_RESIDUAL: dict[str, float] = {}


def make_guards(**overrides: int | float) -> ConvergenceGuards:
    # No hold on the critical level unless a test sets one: these tests check Accordion's
    # interval logic window by window.
    settings_ = {
        "warmup_steps": 10,
        "loss_patience": 5,
        "recovery_windows": 3,
        "critical_hold_windows": 1,
        **overrides,
    }
    return ConvergenceGuards(ConvergenceGuards.Config(**settings_), layers=LAYERS)


def warm_up(guards: ConvergenceGuards, loss: float = 1.0) -> int:
    """Feed a flat loss through warm-up; returns the first compressed step."""
    warmup = guards.config.warmup_steps
    for step in range(warmup):
        guards.observe_loss(step, loss)
    guards.observe_window(warmup - 1, CALM, NO_RESIDUAL)
    return warmup


def events_of(guards: ConvergenceGuards, guard: str) -> list[GuardEvent]:
    return [e for e in guards.events if e.guard == guard]


# ---- non-finite gradients ---------------------------------------------------------------------


def test_nan_gradient_resets_that_layer_and_makes_the_step_uncompressed() -> None:
    guards = make_guards()
    step = warm_up(guards)
    assert not guards.step_uncompressed(step)

    bad = guards.check_nonfinite(step, {"fc1.weight": False, "fc1.bias": True, "fc2.weight": False})

    assert bad == ["fc1.bias"]
    assert guards.step_uncompressed(step)
    assert not guards.step_uncompressed(step + 1)
    assert guards.layers_to_reset() == {"fc1.bias"}
    assert guards.layers_to_reset() == set(), "the reset queue is drained"
    event = events_of(guards, "nonfinite")[-1]
    assert (event.step, event.layer, event.action) == (
        step,
        "fc1.bias",
        "uncompressed step + EF reset",
    )
    assert guards.backoff() == dict.fromkeys(LAYERS, 0), "non-finite gradients do not back off"


def test_all_finite_gradients_change_nothing() -> None:
    guards = make_guards()
    step = warm_up(guards)
    assert guards.check_nonfinite(step, dict.fromkeys(LAYERS, False)) == []
    assert not guards.step_uncompressed(step)
    assert guards.counts()["nonfinite"] == 0


# ---- loss divergence --------------------------------------------------------------------------


def test_sustained_loss_rise_backs_off_every_layer_then_recovers() -> None:
    guards = make_guards()
    step = warm_up(guards, loss=1.0)
    while guards.counts()["loss_divergence"] == 0:
        guards.observe_loss(step, 3.0)
        step += 1
        assert step < 200, "a sustained 3x loss must trigger the divergence guard"
    assert guards.backoff() == dict.fromkeys(LAYERS, 1)
    event = events_of(guards, "loss_divergence")[0]
    assert event.layer is None and event.action == "back off 1 level on every layer"

    # The loss comes back; the EWMA needs a while to fall below the threshold, and the window
    # in which it was still high is not quiet.
    for _ in range(100):
        guards.observe_loss(step, 1.0)
        step += 1
    guards.observe_window(step, CALM, NO_RESIDUAL)
    for window in range(guards.config.recovery_windows):
        assert guards.backoff() == dict.fromkeys(LAYERS, 1), f"recovered early, window {window}"
        for _ in range(10):
            guards.observe_loss(step, 1.0)
            step += 1
        guards.observe_window(step, CALM, NO_RESIDUAL)
    assert guards.backoff() == dict.fromkeys(LAYERS, 0)
    recovered = events_of(guards, "recovered")
    assert len(recovered) == 1 and recovered[0].layer is None
    assert recovered[0].action == "recover 1 level"


def test_loss_staying_high_neither_escalates_nor_recovers() -> None:
    guards = make_guards()
    step = warm_up(guards, loss=1.0)
    while guards.counts()["loss_divergence"] == 0:
        guards.observe_loss(step, 3.0)
        step += 1
    for _ in range(3 * guards.config.recovery_windows):
        guards.observe_loss(step, 2.0)  # still above 1.5x the baseline, no longer rising
        step += 1
        guards.observe_window(step, CALM, NO_RESIDUAL)
    assert guards.backoff() == dict.fromkeys(LAYERS, 1)


def test_single_loss_spike_does_not_trigger() -> None:
    guards = make_guards()
    step = warm_up(guards, loss=1.0)
    guards.observe_loss(step, 100.0)  # EWMA jumps far above 1.5x, then only decays
    for offset in range(1, 200):
        guards.observe_loss(step + offset, 1.0)
    assert guards.counts()["loss_divergence"] == 0
    assert guards.backoff() == dict.fromkeys(LAYERS, 0)


def test_short_loss_rise_within_patience_does_not_trigger() -> None:
    guards = make_guards(loss_ewma_alpha=1.0, loss_patience=5)
    step = warm_up(guards, loss=1.0)
    for offset in range(4):  # rising above 1.5x for fewer than `patience` observations
        guards.observe_loss(step + offset, 2.0 + offset)
    for offset in range(4, 50):
        guards.observe_loss(step + offset, 1.0)
    assert guards.counts()["loss_divergence"] == 0


def test_non_finite_loss_is_ignored_with_an_event() -> None:
    guards = make_guards(loss_ewma_alpha=1.0)
    step = warm_up(guards, loss=1.0)
    before = guards.state_dict()["loss_ewma"]
    guards.observe_loss(step, math.nan)
    guards.observe_loss(step + 1, math.inf)
    guards.observe_loss(step + 2, float(torch.tensor(-math.inf)))
    assert guards.state_dict()["loss_ewma"] == before
    ignored = events_of(guards, "nonfinite")
    assert [e.step for e in ignored] == [step, step + 1, step + 2]
    assert all(e.layer is None and e.action == "ignored" for e in ignored)
    assert guards.backoff() == dict.fromkeys(LAYERS, 0)
    assert not guards.step_uncompressed(step)


def test_baseline_comes_from_warmup_not_from_the_first_compressed_loss() -> None:
    guards = make_guards(loss_ewma_alpha=1.0, loss_patience=1)
    step = warm_up(guards, loss=1.0)
    guards.observe_loss(step, 1.6)  # 1.6 > 1.5 x 1.0 and rising from the reference
    guards.observe_loss(step + 1, 1.7)
    assert guards.counts()["loss_divergence"] == 1


# ---- critical regime and residual growth ------------------------------------------------------


def test_gradient_norm_jump_backs_off_only_that_layer() -> None:
    guards = make_guards()
    step = warm_up(guards)
    jumped = {**CALM, "fc2.weight": CALM["fc2.weight"] * 1.8}  # +80% > 50%
    guards.observe_window(step + 10, jumped, NO_RESIDUAL)
    assert guards.counts()["critical_regime"] == 0, "one window can be noise"
    guards.observe_window(step + 20, jumped, NO_RESIDUAL)
    assert guards.backoff() == {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1}
    event = events_of(guards, "critical_regime")[-1]
    assert (event.layer, event.action) == ("fc2.weight", "back off 1 level")
    assert "for 2 windows" in event.detail
    assert guards.layers_to_reset() == set(), "a critical regime keeps the residual"

    # A drop counts too (Accordion uses the absolute change); small drifts do not. fc2.weight
    # stays at its new level: a calm interval, which ends its critical regime.
    dropped = {**jumped, "fc1.weight": CALM["fc1.weight"] * 0.4, "fc1.bias": 0.12}
    guards.observe_window(step + 30, dropped, NO_RESIDUAL)
    assert guards.backoff()["fc2.weight"] == 0
    guards.observe_window(step + 40, dropped, NO_RESIDUAL)
    assert guards.backoff() == {"fc1.weight": 1, "fc1.bias": 0, "fc2.weight": 0}


def test_one_noisy_window_never_fires() -> None:
    """A spike in one window, then back: no back-off, and the reference did not move."""
    guards = make_guards()
    step = warm_up(guards)
    for window in range(1, 20):
        spiky = {**CALM, "fc2.weight": CALM["fc2.weight"] * (3.0 if window % 2 else 1.0)}
        guards.observe_window(step + 10 * window, spiky, NO_RESIDUAL)
    assert guards.counts()["critical_regime"] == 0
    assert guards.state_dict()["prev_grad_norm"]["fc2.weight"] == pytest.approx(2.0)


def test_an_early_look_feeds_no_norm_to_the_critical_test_but_checks_residuals() -> None:
    """The adaptive loop's looks at steps 1, 2 and 4 hold a sampled step or two: a 10x norm
    there neither fires nor moves the reference, but a runaway residual still resets."""
    guards = make_guards(residual_factor=10.0)
    step = warm_up(guards)
    guards.observe_window(step, CALM, NO_RESIDUAL)
    tenfold = {name: 10.0 * norm for name, norm in CALM.items()}
    for offset in (1, 2):
        guards.observe_window(step + offset, tenfold, NO_RESIDUAL, full_window=False)
    assert guards.counts()["critical_regime"] == 0
    assert guards.state_dict()["prev_grad_norm"]["fc2.weight"] == pytest.approx(CALM["fc2.weight"])
    runaway = {**NO_RESIDUAL, "fc1.weight": 11.0 * CALM["fc1.weight"]}
    guards.observe_window(step + 3, CALM, runaway, full_window=False)
    assert guards.layers_to_reset() == {"fc1.weight"}
    assert guards.counts()["residual_growth"] == 1


@pytest.mark.parametrize("factor", [2.0, 0.5, 65536.0, 2.0**-10])
def test_loss_scale_change_moves_no_statistic(factor: float) -> None:
    """GradScaler multiplies every gradient by its scale: when it grows (x2 every 2000 steps)
    or backs off (x0.5 after an overflow), every layer's norm moves by the same power of two.
    That is recognised and the references follow, so nothing backs off, however long."""
    guards = make_guards()
    step = warm_up(guards)
    if factor < 1.0:  # the scaler backs off only at an overflow
        guards.check_nonfinite(step + 5, dict.fromkeys(LAYERS, True))
    scaled = {name: norm * factor for name, norm in CALM.items()}
    for window in range(1, 6):
        guards.observe_window(step + 10 * window, scaled, NO_RESIDUAL)
    assert guards.counts()["critical_regime"] == 0
    assert guards.backoff() == dict.fromkeys(LAYERS, 0)
    event = events_of(guards, "loss_scale")[-1]
    assert event.action == "gradient-norm references rescaled"
    assert guards.counts()["loss_scale"] == 1
    # A genuine jump of one layer on top of the new scale is still caught.
    jumped = {**scaled, "fc1.weight": scaled["fc1.weight"] * 1.8}
    guards.observe_window(step + 100, jumped, NO_RESIDUAL)
    guards.observe_window(step + 110, jumped, NO_RESIDUAL)
    assert guards.backoff()["fc1.weight"] == 1


def test_a_common_fall_without_an_overflow_is_not_a_loss_scale_change() -> None:
    """A converged classifier's gradients all scale with one loss residual: the digits CNN at
    10 Mbit/s had every norm fall 8x for one window at step 400 and rebound. GradScaler lowers
    its scale only at a non-finite step, so without one the dip is not a scale change: the
    references stay, and neither the dip nor the rebound starts a critical regime."""
    guards = make_guards(critical_patience=2)
    step = warm_up(guards)
    for window in range(1, 4):
        guards.observe_window(step + 10 * window, CALM, NO_RESIDUAL)
    dip = {name: norm / 8.0 for name, norm in CALM.items()}
    guards.observe_window(step + 40, dip, NO_RESIDUAL)
    for window in range(5, 9):
        guards.observe_window(step + 10 * window, CALM, NO_RESIDUAL)
    assert guards.counts()["loss_scale"] == 0, guards.events
    assert guards.counts()["critical_regime"] == 0, guards.events
    assert guards.state_dict()["prev_grad_norm"] == pytest.approx(CALM)

    # The same fall right after an overflow is the scaler's back-off (1/8: three overflows).
    guards.check_nonfinite(step + 85, {"fc1.weight": True})
    guards.observe_window(step + 90, dip, NO_RESIDUAL)
    assert [e.detail for e in events_of(guards, "loss_scale")] == [
        "all gradient norms moved by 0.125x at once (loss scale change)"
    ]
    assert guards.state_dict()["prev_grad_norm"] == pytest.approx(dip)


def test_a_rejected_dip_is_not_divided_out_of_the_next_window() -> None:
    """The common drift of the last window is divided out when looking for a scale change;
    a dip's 1/8 is no drift, so the rebound after it is not read as an 8x growth."""
    guards = make_guards(critical_patience=2)
    step = warm_up(guards)
    guards.observe_window(step + 10, CALM, NO_RESIDUAL)
    guards.observe_window(step + 20, {name: norm / 8.0 for name, norm in CALM.items()}, {})
    guards.observe_window(step + 30, CALM, NO_RESIDUAL)
    assert guards.counts()["loss_scale"] == 0, guards.events
    assert guards.state_dict()["prev_grad_norm"] == pytest.approx(CALM)


def test_layer_recovers_after_quiet_windows() -> None:
    """A residual back-off lifts after ``recovery_windows`` quiet windows, one level each."""
    guards = make_guards(recovery_windows=3, residual_factor=10.0)
    step = warm_up(guards)
    guards.observe_window(step, CALM, {"fc1.weight": 11.0})
    assert guards.backoff()["fc1.weight"] == 1
    for window in range(1, 4):
        assert guards.backoff()["fc1.weight"] == 1
        guards.observe_window(step + 10 * window, CALM, {"fc1.weight": 1.0})
    assert guards.backoff()["fc1.weight"] == 0
    assert [e.layer for e in events_of(guards, "recovered")] == ["fc1.weight"]


def test_a_critical_regime_holds_one_level_until_an_interval_is_calm() -> None:
    """Accordion's two levels, re-chosen each interval. A model converging at a constant
    learning rate drops its norms 50-80% per interval for a while (the digits CNN did, from
    step 200 to 500): that is one regime at one level, not a level per interval; the first
    calm interval lifts it, without waiting out ``recovery_windows``."""
    guards = make_guards(recovery_windows=30, critical_patience=1)
    step = warm_up(guards)
    norm = CALM["fc2.weight"]
    for window in range(1, 5):
        norm *= 0.4  # -60% per interval
        guards.observe_window(step + 10 * window, {**CALM, "fc2.weight": norm}, NO_RESIDUAL)
        assert guards.backoff() == {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1}
    actions = [e.action for e in events_of(guards, "critical_regime")]
    assert actions == ["back off 1 level"] + ["none: critical regime goes on (one level)"] * 3
    assert "level stays 1" in events_of(guards, "critical_regime")[-1].detail

    guards.observe_window(step + 50, {**CALM, "fc2.weight": norm * 0.9}, NO_RESIDUAL)
    assert guards.backoff()["fc2.weight"] == 0
    recovered = events_of(guards, "recovered")[-1]
    assert recovered.layer == "fc2.weight" and "calm interval" in recovered.detail
    # Once lifted, a new regime backs off again.
    guards.observe_window(step + 60, {**CALM, "fc2.weight": norm * 3.0}, NO_RESIDUAL)
    assert guards.backoff()["fc2.weight"] == 1


def test_a_critical_level_changes_at_most_once_per_hold() -> None:
    """A converging model's norms can alternate between moving and calm intervals (the
    digits CNN at 10 Mbit/s did, every 100 steps): without a hold, each interval switched its
    conv weight's compressor. With ``critical_hold_windows`` = 5, the level goes on at the
    first regime, stays on through calm windows until 5 have passed, goes off at the first
    calm one after, and a regime right after that waits out the hold in turn."""
    guards = make_guards(critical_patience=1, critical_hold_windows=5)
    step = warm_up(guards)
    levels = []
    norm = CALM["fc2.weight"]
    for window in range(1, 17):
        moving = window % 2 == 1  # a critical window, then a calm one, and so on
        norm = norm * 0.3 if moving else norm
        guards.observe_window(step + 10 * window, {**CALM, "fc2.weight": norm}, NO_RESIDUAL)
        levels.append(guards.backoff()["fc2.weight"])
    changes = [w for w in range(1, len(levels)) if levels[w] != levels[w - 1]]
    assert levels[0] == 1  # the first regime backs off at once
    assert all(b - a >= 5 for a, b in zip([0, *changes], changes, strict=False)), levels
    assert changes, levels  # it still moves: the hold delays changes, it does not freeze them
    # The other layers were calm throughout.
    assert guards.backoff()["fc1.weight"] == 0


def test_a_regime_waiting_out_the_hold_is_not_a_quiet_window() -> None:
    """A regime that the hold keeps from firing still means the norms moved: that window must
    not count toward lifting the layer's residual back-off."""
    guards = make_guards(
        critical_patience=1, critical_hold_windows=5, recovery_windows=2, residual_factor=10.0
    )
    step = warm_up(guards)
    norm = CALM["fc2.weight"] * 3.0
    guards.observe_window(step + 10, {**CALM, "fc2.weight": norm}, NO_RESIDUAL)  # fires
    for window in range(2, 7):  # calm at the new level; the hold lifts it at window 6
        residual = {"fc2.weight": 11.0 * norm} if window == 6 else NO_RESIDUAL
        guards.observe_window(step + 10 * window, {**CALM, "fc2.weight": norm}, residual)
    state = guards.state_dict()
    assert "fc2.weight" not in state["critical_layers"]
    assert state["layer_level"]["fc2.weight"] == 1  # the residual back-off of window 6
    guards.observe_window(step + 70, {**CALM, "fc2.weight": norm * 3.0}, NO_RESIDUAL)
    state = guards.state_dict()
    assert "fc2.weight" not in state["critical_layers"], "the hold defers the regime"
    assert state["layer_quiet"]["fc2.weight"] == 0


def test_an_open_interval_neither_lifts_nor_holds_a_regime() -> None:
    """With intervals of several windows, only the window that closes one is judged."""
    guards = make_guards(critical_patience=1, critical_block=3)
    step = warm_up(guards)
    for window in range(1, 3):  # with warm-up's last window, the first interval: the reference
        guards.observe_window(step + window, CALM, NO_RESIDUAL)
    for window in range(3, 6):  # +80%: critical at its close
        guards.observe_window(step + window, {**CALM, "fc1.weight": 1.8}, NO_RESIDUAL)
    assert guards.backoff()["fc1.weight"] == 1
    for window in range(6, 8):  # calm windows of an interval still open
        guards.observe_window(step + window, {**CALM, "fc1.weight": 1.8}, NO_RESIDUAL)
        assert guards.backoff()["fc1.weight"] == 1
    guards.observe_window(step + 8, {**CALM, "fc1.weight": 1.8}, NO_RESIDUAL)
    assert guards.backoff()["fc1.weight"] == 0


def test_absent_layer_neither_recovers_nor_loses_its_quiet_count() -> None:
    guards = make_guards(recovery_windows=2, critical_patience=1)
    step = warm_up(guards)
    guards.observe_window(step, {**CALM, "fc1.weight": 5.0}, NO_RESIDUAL)
    others = {k: v for k, v in CALM.items() if k != "fc1.weight"}
    for window in range(5):
        guards.observe_window(step + window + 1, others, NO_RESIDUAL)
    assert guards.backoff()["fc1.weight"] == 1


def test_warmup_records_norms_but_never_backs_off() -> None:
    guards = make_guards(warmup_steps=100)
    guards.observe_window(10, CALM, NO_RESIDUAL)
    guards.observe_window(20, {**CALM, "fc1.weight": 10.0}, {"fc1.weight": 1e6})
    assert guards.backoff() == dict.fromkeys(LAYERS, 0)
    assert guards.layers_to_reset() == set()
    # The first compressed window compares against the last warm-up window.
    guards.observe_window(100, {**CALM, "fc1.weight": 10.0}, NO_RESIDUAL)
    assert guards.counts()["critical_regime"] == 0


def test_residual_growth_resets_and_backs_off() -> None:
    guards = make_guards(residual_factor=10.0)
    step = warm_up(guards)
    healthy = {name: 5.0 * norm for name, norm in CALM.items()}
    guards.observe_window(step, CALM, healthy)
    assert guards.counts()["residual_growth"] == 0

    grown = {**healthy, "fc1.weight": 11.0 * CALM["fc1.weight"]}
    guards.observe_window(step + 10, CALM, grown)
    assert guards.layers_to_reset() == {"fc1.weight"}
    assert guards.backoff() == {"fc1.weight": 1, "fc1.bias": 0, "fc2.weight": 0}
    event = events_of(guards, "residual_growth")[-1]
    assert (event.layer, event.action) == ("fc1.weight", "EF reset + back off 1 level")


def test_critical_regime_and_residual_growth_back_off_one_level_per_window() -> None:
    guards = make_guards(residual_factor=10.0, critical_patience=1)
    step = warm_up(guards)
    guards.observe_window(step, {**CALM, "fc1.weight": 3.0}, {"fc1.weight": 100.0})
    assert guards.backoff()["fc1.weight"] == 1
    assert guards.layers_to_reset() == {"fc1.weight"}
    assert (
        events_of(guards, "residual_growth")[-1].action
        == "EF reset (already backed off this window)"
    )


def test_nonfinite_residual_norm_is_reset_without_back_off() -> None:
    guards = make_guards()
    step = warm_up(guards)
    guards.observe_window(step, CALM, {"fc1.bias": math.nan})
    assert guards.layers_to_reset() == {"fc1.bias"}
    assert guards.backoff() == dict.fromkeys(LAYERS, 0)
    assert events_of(guards, "nonfinite")[-1].action == "EF reset"


def test_backoff_is_clamped_at_max() -> None:
    guards = make_guards(
        max_backoff=2,
        loss_ewma_alpha=1.0,
        loss_patience=1,
        critical_patience=1,
        residual_factor=10.0,
        recovery_windows=100,
    )
    step = warm_up(guards)
    for window in range(3):  # runaway residuals stack fc1.weight's own level
        guards.observe_window(step + window, CALM, {"fc1.weight": 11.0})
    assert guards.backoff()["fc1.weight"] == 2
    assert events_of(guards, "residual_growth")[-1].action == "EF reset (back-off already at max)"
    guards.observe_window(step + 3, {**CALM, "fc1.weight": 3.0}, NO_RESIDUAL)
    assert guards.backoff()["fc1.weight"] == 2
    assert events_of(guards, "critical_regime")[-1].action == "none: back-off already at max"

    for offset in range(12):  # a loss climbing without end: global back-offs pile on top
        guards.observe_loss(step + 10 + offset, 2.0 + offset)
    assert guards.counts()["loss_divergence"] >= 3
    assert guards.state_dict()["global_level"] == 2
    assert events_of(guards, "loss_divergence")[-1].action == "none: back-off already at max"
    assert guards.backoff() == dict.fromkeys(LAYERS, 2)


# ---- bookkeeping ------------------------------------------------------------------------------


def test_warmup_event_recorded_once() -> None:
    guards = make_guards(warmup_steps=5)
    assert [guards.in_warmup(s) for s in range(8)] == [True] * 5 + [False] * 3
    for step in range(8, 20):
        guards.in_warmup(step)
        guards.observe_loss(step, 1.0)
        guards.step_uncompressed(step)
    warmups = events_of(guards, "warmup")
    assert guards.counts()["warmup"] == 1 and len(warmups) == 1
    assert warmups[0].step == 5 and "compression allowed from step 5" in warmups[0].detail
    assert guards.step_uncompressed(4) and not guards.step_uncompressed(5)


def test_events_are_bounded_and_dropped_ones_counted() -> None:
    guards = make_guards(max_events=5, warmup_steps=0)
    for step in range(12):
        guards.observe_loss(step, math.nan)
    assert len(guards.events) == 5
    assert guards.events_dropped == 8  # 12 ignored losses + 1 warm-up event - 5 kept
    assert guards.counts()["nonfinite"] == 12 and guards.counts()["warmup"] == 1
    assert [e.step for e in guards.events] == [7, 8, 9, 10, 11]
    assert set(guards.counts()) == set(GUARD_NAMES)


def test_every_event_is_logged_with_its_step(caplog: pytest.LogCaptureFixture) -> None:
    guards = make_guards(critical_patience=1)
    with caplog.at_level(logging.INFO, logger="autocomp.guards"):
        step = warm_up(guards)
        guards.observe_window(step + 3, {**CALM, "fc2.weight": 9.0}, NO_RESIDUAL)
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert any(f"step {step + 3}: warmup" in m for m in messages)
    assert any(f"step {step + 3}: critical_regime [fc2.weight]" in m for m in messages)


def test_config_rejects_invalid_values() -> None:
    for field, value in [
        ("warmup_steps", -1),
        ("loss_ewma_alpha", 0.0),
        ("loss_divergence_ratio", 1.0),
        ("loss_patience", 0),
        ("critical_change", 0.0),
        ("residual_factor", -1.0),
        ("max_backoff", -1),
        ("recovery_windows", 0),
        ("max_events", 0),
    ]:
        with pytest.raises(ValueError, match=field):
            ConvergenceGuards.Config(**{field: value})


def _scenario(guards: ConvergenceGuards, steps: range) -> None:
    """A deterministic mix of every guard, driven by the step number alone."""
    for step in steps:
        loss = 1.0 if step < 40 else 1.0 + 0.05 * (step - 40) if step < 80 else 1.0
        if step % 17 == 0:
            loss = math.nan
        guards.observe_loss(step, loss)
        guards.check_nonfinite(step, {"fc1.bias": step % 23 == 0})
        if step % 5 == 4:
            scale = 3.0 if step % 35 == 4 else 1.0
            grads = {**CALM, "fc2.weight": CALM["fc2.weight"] * scale}
            residuals = {"fc1.weight": 40.0 if step % 45 == 9 else 1.0}
            guards.observe_window(step, grads, residuals)


def test_state_dict_round_trip_reproduces_decisions() -> None:
    config = {"warmup_steps": 10, "loss_patience": 4, "recovery_windows": 2, "max_events": 50}
    original = make_guards(**config)
    _scenario(original, range(60))
    saved = json.loads(json.dumps(original.state_dict(), allow_nan=False))
    restored = make_guards(**config)
    restored.load_state_dict(saved)
    assert restored.state_dict() == original.state_dict()

    _scenario(original, range(60, 160))
    _scenario(restored, range(60, 160))
    assert original.counts()["loss_divergence"] > 0 and original.counts()["recovered"] > 0
    assert restored.events == original.events
    assert restored.counts() == original.counts()
    assert restored.backoff() == original.backoff()
    assert restored.layers_to_reset() == original.layers_to_reset()
    assert restored.state_dict() == original.state_dict()


def test_load_state_dict_rejects_unknown_version() -> None:
    guards = make_guards()
    state = guards.state_dict()
    state["version"] = 99
    with pytest.raises(ValueError, match="version"):
        guards.load_state_dict(state)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 10.0),
            st.dictionaries(st.sampled_from(LAYERS), st.floats(0.0, 100.0), max_size=3),
            st.dictionaries(st.sampled_from(LAYERS), st.floats(0.0, 1e4), max_size=3),
        ),
        max_size=40,
    )
)
@example(  # a denormal norm once overflowed the loss-scale detector's log2 (found by this test)
    [
        (0.0, {}, {}),
        (0.0, {"fc1.weight": 1.0, "fc1.bias": 2.0}, {}),
        (0.0, {"fc1.weight": 0.0}, {}),
        (0.0, {"fc1.bias": 1.0, "fc1.weight": 1.1125369292536007e-308}, {}),
        (0.0, {"fc1.weight": 1.0, "fc1.bias": 1.0}, {}),
    ]
)
def test_levels_stay_in_range_and_decisions_are_deterministic(
    script: list[tuple[float, dict[str, float], dict[str, float]]],
) -> None:
    runs = []
    for _ in range(2):
        guards = make_guards(warmup_steps=2, max_backoff=3, loss_patience=2)
        for step, (loss, grads, residuals) in enumerate(script):
            guards.observe_loss(step, loss)
            guards.observe_window(step, grads, residuals)
            assert all(0 <= level <= 3 for level in guards.backoff().values())
        runs.append((guards.events, guards.backoff(), guards.layers_to_reset()))
    assert runs[0] == runs[1]


# ---- torch helpers ----------------------------------------------------------------------------


def test_helpers_feed_the_guards_from_real_tensors() -> None:
    generator = torch.Generator().manual_seed(0)
    grads = {
        "fc1.weight": torch.randn(8, 4, generator=generator),
        "fc1.bias": torch.randn(8, generator=generator).half(),
        "fc2.weight": torch.randn(3, 8, generator=generator),
    }
    norms = layer_norms(grads)
    for name, tensor in grads.items():
        assert norms[name] == pytest.approx(tensor.float().norm().item(), rel=1e-5)

    residuals = {name: 0.5 * t.float() for name, t in grads.items()}
    residuals["fc2.weight"] = 50.0 * grads["fc2.weight"]
    guards = make_guards(residual_factor=32.0, warmup_steps=0)
    guards.observe_window(0, norms, layer_norms(residuals))
    assert guards.layers_to_reset() == {"fc2.weight"}
    assert guards.backoff() == {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1}

    grads["fc1.bias"][3] = math.inf  # fp16 overflow, as a loss scaler would produce
    grads["fc1.weight"][2, 1] = math.nan
    flags = nonfinite_layers(grads)
    assert flags == {"fc1.weight": True, "fc1.bias": True, "fc2.weight": False}
    assert guards.check_nonfinite(1, flags) == ["fc1.bias", "fc1.weight"]
    assert guards.step_uncompressed(1)
    assert guards.layers_to_reset() == {"fc1.bias", "fc1.weight"}


def test_nonfinite_mask_is_exact_for_large_finite_values() -> None:
    big = torch.full((1000,), torch.finfo(torch.float32).max)  # an fp32 sum would overflow
    half_big = torch.full((1000,), torch.finfo(torch.float16).max, dtype=torch.float16)
    cancel = torch.tensor([math.inf, -math.inf])  # inf - inf = nan: still caught
    mask = nonfinite_mask([big, half_big, cancel, torch.zeros(0), torch.tensor([math.nan])])
    assert mask.dtype == torch.bool
    assert mask.tolist() == [False, False, True, False, True]
    assert nonfinite_mask([]).numel() == 0
    assert nonfinite_layers({}) == {} and layer_norms({}) == {}


def test_helpers_accept_views_of_a_flat_bucket() -> None:
    bucket = torch.arange(12, dtype=torch.float32)
    views = {"a": bucket[:5], "b": bucket[5:].view(7)}
    bucket[7] = math.nan
    assert nonfinite_layers(views) == {"a": False, "b": True}
    assert layer_norms({"a": views["a"]})["a"] == pytest.approx(math.sqrt(30.0))
