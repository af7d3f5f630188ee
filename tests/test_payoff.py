"""Tier 1: the payoff check (pure unit, no processes).

A compressed window is compared with the latest uncompressed one on a similar link; no
``min_gain`` speed-up starts a hold, which ends after ``hold_windows`` or when the link
estimate moves by ``link_change``. The engine then leaves the optimizer's layers
uncompressed with the hold's reason, pins untouched.
"""

from __future__ import annotations

import pytest
import torch

from autocomp.policy import LayerProfile, PolicyEngine, PolicyRules, StepTiming
from autocomp.policy.payoff import PayoffCheck

GBIT = 1e9 / 8


def test_a_compressed_window_that_is_not_faster_starts_a_hold() -> None:
    check = PayoffCheck()
    assert check.observe(1, compressed=False, step_seconds=0.220, bandwidth=8 * GBIT) is None
    note = check.observe(2, compressed=True, step_seconds=0.215, bandwidth=7 * GBIT)
    assert note is not None and "gain 2.3% < min_gain 5%" in note
    assert check.holds == 1 and check.last_gain == pytest.approx(1 - 0.215 / 0.220)
    reason = check.hold_reason(3, 8 * GBIT)
    assert reason is not None and "held off until window 12" in reason
    assert check.hold_reason(11, 8 * GBIT) is not None
    assert check.hold_reason(12, 8 * GBIT) is None  # expired: the engine may try again
    assert check.hold_reason(13, 8 * GBIT) is None


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
    assert check.observe(3, True, 2.9, 0.2 * GBIT) is not None  # 3% < 10%
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
    for bad in ({"min_gain": 1.0}, {"hold_windows": 0}, {"link_change": 1.0}):
        with pytest.raises(ValueError):
            PayoffCheck.Config(**bad)  # type: ignore[arg-type]


class _Link:
    """A 50 Mbit/s link: every big layer would be compressed."""

    bandwidth_bytes_per_s = 50e6 / 8

    def comm_seconds(self, collective: object, payload_bytes: int, world_size: int) -> float:
        return 1e-4 + payload_bytes / self.bandwidth_bytes_per_s

    def compress_seconds(self, compressor: object, shape: torch.Size) -> float:
        return 1e-3


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
