"""Tier 1: pure unit, no processes.

``autocomp.step_gap.StepGap``: the median of the recent measured-minus-predicted steps,
clamped to [0, max_compute_share x compute], with its state round trip and input checks. And
the planner feeding it: only from full windows that ran the previous decision's plan
throughout (the window before ran it too), the result carried into every prediction
(``sync_seconds`` in the decision) and into the planner's checkpoint.
"""

from __future__ import annotations

import json
import math

import pytest

from autocomp.step_gap import StepGap
from tests.test_planner import NAMES, measurement, planner


def test_the_gap_is_the_median_of_the_last_windows() -> None:
    gap = StepGap(StepGap.Config(samples=3))
    assert gap.raw_seconds is None and gap.seconds == 0.0
    for measured in (0.0120, 0.0125, 0.0300):  # one outlier among three
        gap.observe(measured, compute=0.008, predicted_added=0.002)
    assert gap.raw_seconds == pytest.approx(0.0025)
    assert gap.seconds == pytest.approx(0.0025)
    for measured in (0.0130, 0.0130):  # the oldest drop out
        gap.observe(measured, compute=0.008, predicted_added=0.002)
    assert gap.seconds == pytest.approx(0.003)


def test_the_gap_is_clamped_to_zero_and_to_a_share_of_the_compute() -> None:
    """A model that over-predicts (slow links) adds nothing; a gap larger than half the
    compute-only step is mostly the plan's own miss, and counts only up to that."""
    over = StepGap()
    over.observe(0.9, compute=0.1, predicted_added=1.0)
    assert over.raw_seconds == pytest.approx(-0.2) and over.seconds == 0.0
    large = StepGap()
    large.observe(1.0, compute=0.1, predicted_added=0.2)
    assert large.raw_seconds == pytest.approx(0.7)
    assert large.seconds == pytest.approx(0.05)  # 0.5 x compute
    off = StepGap(StepGap.Config(max_compute_share=0.0))
    off.observe(1.0, compute=0.1, predicted_added=0.2)
    assert off.seconds == 0.0


def test_bad_inputs_and_settings_raise() -> None:
    gap = StepGap()
    for args in ((math.nan, 0.1, 0.0), (0.1, -0.1, 0.0), (0.1, 0.1, math.inf)):
        with pytest.raises(ValueError, match="step gap inputs"):
            gap.observe(*args)
    with pytest.raises(ValueError, match="samples"):
        StepGap.Config(samples=0)
    with pytest.raises(ValueError, match="max_compute_share"):
        StepGap.Config(max_compute_share=-1.0)
    with pytest.raises(ValueError, match="non-finite"):
        gap.load_state_dict({"gaps": [math.nan], "compute": 0.1})


def test_state_round_trips_through_json() -> None:
    gap = StepGap()
    for measured in (0.012, 0.013):
        gap.observe(measured, compute=0.005, predicted_added=0.004)
    restored = StepGap()
    restored.load_state_dict(json.loads(json.dumps(gap.state_dict())))
    assert restored.seconds == gap.seconds and restored.raw_seconds == gap.raw_seconds


def test_the_planner_measures_the_gap_on_settled_windows_and_predicts_with_it() -> None:
    """Steps measure the model's prediction plus 3 ms. The planner takes the gap only from a
    full window whose plan ran the window before too, and every later prediction carries it:
    the next window's predicted step is its measured step again."""
    true_gap = 0.003
    compute = 0.05
    p = planner(warmup_steps=0)
    current = dict.fromkeys(NAMES, "none")
    observed: list[int] = []
    for index in range(1, 9):
        step = 10 * index
        m = measurement(step, mbit=200, compute=compute, specs=current)
        last = p.last_decision
        if last is not None:  # the plan that ran: its prediction without the gap, plus 3 ms
            m.timings["step_seconds"] = last.predicted_step_seconds - last.sync_seconds + true_gap
            m.timings["compute_seconds"] = compute
        before = len(p.step_gap.state_dict()["gaps"])
        update = p.decide(m, current)
        if len(p.step_gap.state_dict()["gaps"]) > before:
            observed.append(step)
        plan = dict(zip(NAMES, update.plan, strict=True))
        decision = update.record.decision
        assert decision is not None
        assert decision["sync_seconds"] == pytest.approx(p.step_gap.seconds)
        current = plan
    # Step 10: no decision before it. Step 20: the window after the first decision's switch.
    assert observed and observed[0] >= 30 and 10 not in observed and 20 not in observed
    assert p.step_gap.seconds == pytest.approx(true_gap)
    last = p.last_decision
    assert last is not None and last.sync_seconds == pytest.approx(true_gap)
    assert last.predicted_step_seconds == pytest.approx(
        compute + true_gap + (last.predicted_step_seconds - compute - last.sync_seconds)
    )
    restored = planner(warmup_steps=0)
    restored.load_state_dict(json.loads(json.dumps(p.state_dict())))
    assert restored.step_gap.seconds == pytest.approx(true_gap)


def test_a_window_after_a_switch_feeds_no_gap() -> None:
    """A switch's first window pays one-off costs (warm starts, DDP's rebuild at the first):
    it is not read as a gap, however long it measured."""
    p = planner(warmup_steps=0)
    current = dict.fromkeys(NAMES, "none")
    first = p.decide(measurement(10, mbit=50, specs=current), current)
    switched = dict(zip(NAMES, first.plan, strict=True))
    assert switched != current
    m = measurement(20, mbit=50, specs=switched)
    m.timings["step_seconds"] = 10.0  # a very slow first window of the new plan
    p.decide(m, switched)
    assert p.step_gap.raw_seconds is None and p.step_gap.seconds == 0.0
