"""Tier 1: pure unit, no processes.

Layers a rule holds at 'none' (1-D, under ``min_numel``) take their bucket's lossless cast
when that saves the bucket a collective: some layer of the bucket is on fp16/bf16 without
error feedback and no other layer sends an all-reduce payload of the held layers' dtype.
Also through the engine: the riders' rule is ``ride_along`` and their reason keeps the rule
that held them; a held plan (no cast) carries no riders. A searched layer left at 'none' beside
a cast is completed onto it when the exposure model, which then counts the bucket's float32
all-reduce as gone, predicts the step no longer.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from autocomp.compressors import Compressor
from autocomp.policy import LayerProfile, PolicyDecision, PolicyEngine, PolicyRules, StepTiming
from autocomp.policy.ride_along import cast_only_buckets, completions, riders
from autocomp.policy.types import LayerDecision
from tests.test_policy_engine import AFTER_WARMUP, TIMING, FakeCostModel
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


def test_completions_propose_a_buckets_open_layers_and_cast_only_buckets_are_named() -> None:
    """A searched layer the search left at 'none' beside a cast is proposed for the cast
    (the engine keeps it if its model predicts no longer a step); a bucket with a cast and
    nothing else of its own dtype is cast-only (one all-reduce, the cast's)."""
    layers, decisions = _bucket([FP16, "none"])
    searched = [0, 2]  # the two matrices
    assert completions(layers, decisions, searched) == {2: FP16}
    assert completions(layers, decisions, [0]) == {}  # a rule's 'none' is not open
    assert cast_only_buckets(layers, decisions) == set()
    all_cast, all_decisions = _bucket([FP16, FP16])
    assert cast_only_buckets(all_cast, all_decisions) == {0}
    blocked, blocked_decisions = _bucket([FP16, "none", "powersgd:rank=4,ef=true"])
    assert completions(blocked, blocked_decisions, [0, 2, 4]) == {}


class _PerTensorCast(FakeCostModel):
    """The fake link, with a cast priced per tensor as the wrap-time calibration prices it:
    a fixed ``cast_seconds`` on top of its elements; ``device_type`` as a CostModel's."""

    def __init__(self, mbit_per_s: float, cast_seconds: float, device_type: str) -> None:
        super().__init__(mbit_per_s)
        self.cast_seconds = cast_seconds
        self.config = SimpleNamespace(device_type=device_type)

    def compress_seconds(
        self, compressor: Compressor, shape: torch.Size, nonzero_share: float = 1.0
    ) -> float:
        work = super().compress_seconds(compressor, shape, nonzero_share)
        return work + (self.cast_seconds if compressor.name == "fp16" else 0.0)


def test_the_engine_completes_a_bucket_when_that_drops_its_float32_all_reduce() -> None:
    """At 1 Gbit/s with little backward to hide behind, fp16 pays on a 512x512 matrix; on a
    32x64 one it saves 33 us of bytes for 40-60 us of work priced per tensor, so the search
    alone leaves it uncompressed, beside a bucket-wide float32 all-reduce of 100 us.

    On CPU the hook casts the bucket as one span, so a layer that joins it is priced at the
    span's per-element rate (the big matrix's): completed, with the biases riding, the
    bucket sends one all-reduce, and the plan is predicted faster than with the small matrix
    pinned to 'none'. On CUDA (the per-layer path) the per-tensor price stands: at 40 us a
    tensor the completion still wins (3 x 40 - 33 < 100 us), at 60 us it loses and is not
    made."""
    layers = [
        _layer("big.weight", (512, 512)),
        _layer("big.bias", (512,)),
        _layer("small.weight", (32, 64)),
        _layer("small.bias", (32,)),
    ]
    timing = StepTiming(backward_seconds=0.01, hideable_seconds=0.001, step_seconds=0.02)
    rules = PolicyRules(candidates=("none", FP16))

    def decide(cast_seconds: float, device: str, **kwargs: object) -> PolicyDecision:
        costs = _PerTensorCast(1000, cast_seconds, device)
        engine = PolicyEngine(rules, costs, target_overlap=0.9)
        return engine.decide(layers, timing, AFTER_WARMUP, 2, **kwargs)  # type: ignore[arg-type]

    for cast_seconds, device in ((60e-6, "cpu"), (40e-6, "cuda")):
        decision = decide(cast_seconds, device)
        assert set(decision.plan.values()) == {FP16}, (device, decision.plan)
        small = decision.layer("small.weight")
        assert "completes its bucket's fp16:ef=false" in small.reason, small.reason
        assert decision.layer("small.bias").rule == "ride_along"
        pinned = decide(cast_seconds, device, pins=[("small.weight", "none")])
        assert pinned.plan["small.weight"] == "none" and pinned.plan["big.weight"] == FP16
        assert pinned.layer("big.bias").rule == "1d"  # a float32 all-reduce stays: no ride
        assert decision.predicted_step_seconds < pinned.predicted_step_seconds - 10e-6
    kept = decide(60e-6, "cuda")
    assert kept.plan["small.weight"] == "none" and kept.layer("big.bias").rule == "1d"
