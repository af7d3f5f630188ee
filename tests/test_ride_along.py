"""Tier 1: pure unit, no processes.

Layers a rule holds at 'none' (1-D, under ``min_numel``) take their bucket's lossless cast
when that saves the bucket a collective: some layer of the bucket is on fp16/bf16 without
error feedback and no other layer sends an all-reduce payload of the held layers' dtype.
Also through the engine: the riders' rule is ``ride_along`` and their reason keeps the rule
that held them; a held plan (no cast) carries no riders.
"""

from __future__ import annotations

import torch

from autocomp.policy import LayerProfile, PolicyEngine, PolicyRules
from autocomp.policy.ride_along import riders
from autocomp.policy.types import LayerDecision
from tests.test_policy_engine import AFTER_WARMUP, TIMING
from tests.test_policy_engine import engine as build_engine  # its fake cost model

FP16 = "fp16:ef=false"


def _layer(
    name: str, shape: tuple[int, ...], bucket: int | None = 0, dtype: torch.dtype = torch.float32
) -> LayerProfile:
    return LayerProfile(
        name=name, shape=torch.Size(shape), grad_norm=1.0, bucket=bucket, dtype=dtype
    )


def _decided(name: str, spec: str, rule: str = "slack") -> LayerDecision:
    return LayerDecision(
        name=name,
        spec=spec,
        reason=f"{rule} decided",
        rule=rule,
        predicted_seconds=0.0,
        predicted_wire_bytes=0,
        predicted_error=0.0,
    )


def _bucket(
    specs: list[str], bucket: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[list[LayerProfile], list[LayerDecision | None]]:
    """A matrix per spec, each followed by its bias (held by the 1-D rule), then a small
    matrix under min_numel (held as too small)."""
    layers: list[LayerProfile] = []
    decisions: list[LayerDecision | None] = []
    for i, spec in enumerate(specs):
        layers += [
            _layer(f"b{bucket}.fc{i}.weight", (64, 64), bucket, dtype),
            _layer(f"b{bucket}.fc{i}.bias", (64,), bucket, dtype),
        ]
        decisions += [
            _decided(f"b{bucket}.fc{i}.weight", spec),
            _decided(f"b{bucket}.fc{i}.bias", "none", "1d"),
        ]
    layers.append(_layer(f"b{bucket}.scale", (4, 4), bucket, dtype))
    decisions.append(_decided(f"b{bucket}.scale", "none", "too_small"))
    return layers, decisions


def _held(layers: list[LayerProfile]) -> list[int]:
    return [i for i, layer in enumerate(layers) if not layer.name.endswith("weight")]


def test_held_layers_take_their_buckets_lossless_cast() -> None:
    layers, decisions = _bucket([FP16, FP16])
    assert riders(layers, decisions) == dict.fromkeys(_held(layers), FP16)
    # bf16 too; an all-gather beside the cast (int8, top-k) does not stop it.
    for specs, cast in (
        (["bf16:ef=false"], "bf16:ef=false"),
        ([FP16, "int8:chunk=256,ef=true"], FP16),
        (["topk:ratio=0.01,ef=true", FP16], FP16),
    ):
        layers, decisions = _bucket(specs)
        assert riders(layers, decisions) == dict.fromkeys(_held(layers), cast), specs


def test_no_ride_where_it_saves_no_collective_or_the_cast_is_not_lossless() -> None:
    for specs in (
        [FP16, "none"],  # a matrix sends float32 anyway
        [FP16, "powersgd:rank=4,ef=true"],  # the float32 parts join its factors' round
        ["int8:chunk=256,ef=true"],  # no cast to ride
        ["fp16:ef=true"],  # error feedback: a residual per layer, not lossless
        ["none", "none"],
    ):
        layers, decisions = _bucket(specs)
        assert riders(layers, decisions) == {}, specs
    # Gradients already 16-bit gain nothing from a 16-bit cast.
    layers, decisions = _bucket([FP16], dtype=torch.float16)
    assert riders(layers, decisions) == {}
    # A pin to none is not a rule that yields to a cast, and it sends float32 itself.
    layers, decisions = _bucket([FP16])
    decisions[1] = _decided(layers[1].name, "none", "pin")
    assert riders(layers, decisions) == {}


def test_each_bucket_is_judged_on_its_own() -> None:
    first, first_decisions = _bucket([FP16, FP16], bucket=0)
    second, second_decisions = _bucket([FP16, "none"], bucket=1)
    chosen = riders(first + second, first_decisions + second_decisions)
    assert chosen == dict.fromkeys(_held(first), FP16)


def test_the_engine_names_the_riders_and_a_held_plan_has_none() -> None:
    """On a slow link fp16 everywhere it may go: the biases and the small tensor ride along,
    with the rule that held them in their reason; held by the payoff check, nothing rides."""
    layers = [
        _layer("fc0.weight", (512, 512)),
        _layer("fc0.bias", (512,)),
        _layer("fc1.weight", (512, 512)),
        _layer("fc1.bias", (512,)),
        _layer("scale", (8, 8)),
    ]
    engine: PolicyEngine = build_engine(50, PolicyRules(candidates=("none", FP16)))
    decision = engine.decide(layers, TIMING, AFTER_WARMUP, 2)
    assert decision.plan["fc0.weight"] == decision.plan["fc1.weight"] == FP16
    for name, held_by in (("fc0.bias", "1-D"), ("fc1.bias", "1-D"), ("scale", "too small")):
        layer = decision.layer(name)
        assert layer.spec == FP16 and layer.rule == "ride_along", layer
        assert "rides along with its bucket's fp16:ef=false" in layer.reason
        assert held_by in layer.reason
    held = engine.decide(layers, TIMING, AFTER_WARMUP, 2, hold_reason="held for a test")
    assert set(held.plan.values()) == {"none"}
    assert held.layer("fc0.bias").rule == "1d"
