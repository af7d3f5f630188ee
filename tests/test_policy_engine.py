"""Tier 1: pure unit, no processes.

Covers ``autocomp.policy.engine`` with a fake alpha-beta cost model and the profile of a
16M-parameter MLP: warmup, the operator override, no measurement yet, a single rank and a fast
link all give 'none' with their reasons; on a slow link (200 Mbit/s) the big layers are
compressed and the predicted overlap meets the target unless the decision says infeasible;
pins (given in code and in the policy) win, in order; guard back-off moves a layer to a lighter
candidate; tiny and 1-D tensors are never compressed; the plan changes when bandwidth drops from
1000 to 50 Mbit/s; candidates that would not compress a layer are skipped; measured relative
errors override the priors; the overlap arithmetic (C, exposed, overlap, budget = H / t, the
per-bucket latency) is as documented; every layer has a specific reason; identical inputs give
identical, JSON-serializable decisions.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from autocomp.compressors import Collective, Compressor, build_compressor
from autocomp.policy import (
    CostModelProtocol,
    ErrorPriors,
    LayerProfile,
    PolicyEngine,
    PolicyRules,
    StepTiming,
    load_policy,
)

ALPHA = 50e-6
"""Fake per-hop latency (seconds)."""
WORLD = 4
TIMING = StepTiming(backward_seconds=0.30, hideable_seconds=0.25, step_seconds=0.50)
TARGET = 0.9
AFTER_WARMUP = 10_000

# Compression work per element, seconds (PowerSGD: per element and per unit of rank).
_PER_ELEMENT = {"fp16": 0.2e-9, "bf16": 0.2e-9, "int8": 1e-9, "sign": 1e-9, "topk": 3e-9}
_POWERSGD_PER_RANK = 0.1e-9


class FakeCostModel:
    """Ring all-reduce / all-gather alpha-beta model on one shared link."""

    def __init__(self, mbit_per_s: float | None, alpha: float = ALPHA) -> None:
        self._bandwidth = None if mbit_per_s is None else mbit_per_s * 1e6 / 8
        self.alpha = alpha
        self.calls = 0

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        return self._bandwidth

    def comm_seconds(self, collective: Collective, payload_bytes: int, world_size: int) -> float:
        self.calls += 1
        hops = world_size - 1
        if hops == 0:
            return 0.0
        bandwidth = self._bandwidth or 1.25e9
        if collective is Collective.ALL_REDUCE:
            return 2 * hops * self.alpha + 2 * hops / world_size * payload_bytes / bandwidth
        return hops * self.alpha + hops * payload_bytes / bandwidth

    def compress_seconds(self, compressor: Compressor, shape: torch.Size) -> float:
        if compressor.name == "powersgd":
            return _POWERSGD_PER_RANK * int(compressor.config["rank"]) * shape.numel()
        return _PER_ELEMENT.get(compressor.name, 0.0) * shape.numel()


def mlp_profile() -> list[LayerProfile]:
    """A 16M-parameter MLP: four big weights, biases, a LayerNorm and a small head."""
    weights = [(4096, 1024), (2048, 2048), (2048, 2048), (1024, 3072)]
    layers = []
    for index, shape in enumerate(weights):
        norm = 1.0 + 0.5 * index
        layers.append(LayerProfile(name=f"fc{index}.weight", shape=shape, grad_norm=norm))
        layers.append(LayerProfile(name=f"fc{index}.bias", shape=(shape[0],), grad_norm=0.1))
    layers.append(LayerProfile(name="norm.weight", shape=(1024,), grad_norm=0.05))
    layers.append(LayerProfile(name="norm.bias", shape=(1024,), grad_norm=0.05))
    layers.append(LayerProfile(name="head.weight", shape=(10, 1024), grad_norm=0.5))
    return layers


BIG = [f"fc{i}.weight" for i in range(4)]


def test_profile_is_16m_parameters() -> None:
    total = sum(layer.numel for layer in mlp_profile())
    assert 15_000_000 < total < 17_500_000


def engine(
    mbit: float | None, rules: PolicyRules | None = None, target: float = TARGET
) -> PolicyEngine:
    cost = FakeCostModel(mbit)
    assert isinstance(cost, CostModelProtocol)
    return PolicyEngine(rules or load_policy("default"), cost, target_overlap=target)


def decide(mbit: float | None, **kwargs: object) -> object:
    rules = kwargs.pop("rules", None)
    target = kwargs.pop("target", TARGET)
    step = kwargs.pop("step", AFTER_WARMUP)
    world = kwargs.pop("world_size", WORLD)
    return engine(mbit, rules, target).decide(mlp_profile(), TIMING, step, world, **kwargs)  # type: ignore[arg-type]


def assert_reasons(decision: object) -> None:
    for layer in decision.layers:  # type: ignore[attr-defined]
        assert layer.reason.strip(), layer
        assert layer.rule, layer


# ---- rules ---------------------------------------------------------------------------------


def test_warmup_sends_everything_uncompressed() -> None:
    decision = decide(50, step=3)
    assert set(decision.plan.values()) == {"none"}
    assert all(layer.rule == "warmup" for layer in decision.layers)
    assert decision.layers[0].reason == "warmup: step 3 < warmup_steps 100"
    # On a 50 Mbit/s link, uncompressed traffic cannot meet the target: said so.
    assert not decision.feasible
    assert decision.predicted_overlap < TARGET
    assert_reasons(decision)


def test_warmup_beats_pins() -> None:
    decision = decide(50, step=0, pins=[("fc0.weight", "int8")])
    assert decision.layer("fc0.weight").spec == "none"


def test_force_none_is_an_operator_override() -> None:
    decision = decide(50, force_none=True)
    assert set(decision.plan.values()) == {"none"}
    assert {layer.reason for layer in decision.layers} == {"operator override: force none"}


def test_fast_link_sends_everything_uncompressed() -> None:
    decision = decide(40_000)  # 40 Gbit/s >= default's 25
    assert set(decision.plan.values()) == {"none"}
    for name in BIG:
        layer = decision.layer(name)
        assert layer.rule == "fast_link"
        assert layer.reason == "fast link: 40 Gbit/s >= 25"
    assert_reasons(decision)


def test_no_bandwidth_measurement_yet() -> None:
    decision = decide(None)
    assert set(decision.plan.values()) == {"none"}
    assert decision.layer("fc0.weight").reason == "no bandwidth measurement yet"


def test_single_rank_needs_no_compression() -> None:
    decision = decide(50, world_size=1)
    assert set(decision.plan.values()) == {"none"}
    assert decision.layer("fc0.weight").rule == "single_rank"
    assert decision.predicted_comm_seconds == 0.0
    assert decision.predicted_overlap == 1.0


@pytest.mark.parametrize("mbit", [50, 200, 1000])
def test_tiny_and_1d_never_compressed(mbit: float) -> None:
    decision = decide(mbit)
    for name in ("fc0.bias", "fc1.bias", "norm.weight", "norm.bias", "head.weight"):
        layer = decision.layer(name)
        assert layer.spec == "none"
        assert layer.rule in ("too_small", "1d")
    assert decision.layer("head.weight").reason == "too small: 10240 elements < min_numel 16384"


def test_large_1d_tensor_follows_compress_1d() -> None:
    big_bias = LayerProfile(name="big.bias", shape=(1_000_000,), grad_norm=1.0)
    timing = StepTiming(backward_seconds=0.01, hideable_seconds=0.005, step_seconds=0.02)
    off = engine(50).decide([big_bias], timing, AFTER_WARMUP, WORLD)
    assert off.layers[0].spec == "none" and off.layers[0].reason == "1-D: compress_1d is false"
    rules = PolicyRules(compress_1d=True)
    on = engine(50, rules).decide([big_bias], timing, AFTER_WARMUP, WORLD)
    assert on.layers[0].spec != "none"
    assert not on.layers[0].spec.startswith("powersgd")  # PowerSGD cannot compress 1-D


# ---- the optimizer's layers -----------------------------------------------------------------


def test_slow_link_compresses_big_layers_and_meets_target() -> None:
    decision = decide(200)
    for name in BIG:
        layer = decision.layer(name)
        assert layer.spec != "none", layer
        assert layer.rule in ("knapsack", "infeasible")
        assert layer.predicted_wire_bytes < mlp_layer(name).raw_bytes
    if decision.feasible:
        assert decision.predicted_overlap >= TARGET - 1e-9
        assert decision.predicted_comm_seconds <= decision.budget_seconds * (1 + 1e-9)
    else:
        assert decision.predicted_overlap < TARGET
    assert decision.feasible  # with these numbers the target is reachable
    assert_reasons(decision)


def mlp_layer(name: str) -> LayerProfile:
    return next(layer for layer in mlp_profile() if layer.name == name)


def test_knapsack_reasons_are_specific() -> None:
    decision = decide(200)
    for name in BIG:
        layer = decision.layer(name)
        assert layer.reason.startswith(f"knapsack: {layer.spec} predicts ")
        assert " s, " in layer.reason and "B, rel. error" in layer.reason
        assert layer.runner_up is not None
        assert f"; runner-up {layer.runner_up} " in layer.reason
        assert layer.runner_up_seconds is not None and layer.runner_up_error is not None
        assert layer.runner_up != layer.spec


def test_decision_changes_when_bandwidth_drops() -> None:
    fast = decide(1000)
    slow = decide(50)
    assert fast.plan != slow.plan
    assert slow.predicted_wire_bytes < fast.predicted_wire_bytes
    assert slow.predicted_error > fast.predicted_error
    for name in BIG:
        assert slow.layer(name).predicted_wire_bytes <= fast.layer(name).predicted_wire_bytes


def test_infeasible_target_is_flagged() -> None:
    timing = StepTiming(backward_seconds=1e-4, hideable_seconds=1e-5, step_seconds=1e-3)
    decision = engine(50).decide(mlp_profile(), timing, AFTER_WARMUP, WORLD)
    assert not decision.feasible
    assert decision.solver.endswith("(relaxed)")
    for name in BIG:
        layer = decision.layer(name)
        assert layer.rule == "infeasible"
        assert layer.reason.startswith("target out of reach, least-error plan near the least")
        assert layer.spec != "none"
    assert decision.predicted_overlap < TARGET


def test_zero_target_puts_no_bound() -> None:
    decision = decide(50, target=0.0)
    assert math.isinf(decision.budget_seconds)
    assert set(decision.plan.values()) == {"none"}  # least error everywhere
    assert decision.feasible
    assert decision.to_dict()["budget_seconds"] is None


def test_none_chosen_when_it_fits() -> None:
    # A link just below the fast-link threshold, and plenty of backward time to hide behind.
    timing = StepTiming(backward_seconds=5.0, hideable_seconds=4.0, step_seconds=6.0)
    decision = engine(20_000).decide(mlp_profile(), timing, AFTER_WARMUP, WORLD)
    assert set(decision.plan.values()) == {"none"}
    assert decision.solver == "least-error"
    assert decision.layer("fc0.weight").reason.startswith("knapsack: none predicts ")


# ---- pins and back-off ----------------------------------------------------------------------


def test_pins_win_in_order() -> None:
    rules = PolicyRules(pins=(("fc1.*", "fp16"), ("*.weight", "int8")))
    decision = decide(
        200, rules=rules, pins=[("fc1.weight", "sign"), ("head.*", "powersgd:rank=1")]
    )
    assert decision.layer("fc1.weight").spec == "sign:chunk=256,ef=true"
    assert decision.layer("fc1.weight").reason == "pinned by fc1.weight"
    assert decision.layer("fc1.bias").spec == "fp16:ef=true"  # pin beats 1-D and tiny
    assert decision.layer("fc0.weight").spec == "int8:chunk=256,ef=true"
    assert decision.layer("fc0.weight").rule == "pin"
    assert decision.layer("head.weight").spec == "powersgd:rank=1,ef=true"
    assert decision.layer("head.weight").reason == "pinned by head.*"


def test_pins_count_against_the_budget() -> None:
    free = decide(200)
    pinned = decide(200, pins=[("fc1.weight", "none")])
    assert pinned.layer("fc1.weight").spec == "none"
    # fc1 alone uncompressed exceeds the budget at 200 Mbit/s: nothing else can fix that.
    assert not pinned.feasible
    assert pinned.predicted_comm_seconds > free.predicted_comm_seconds


def test_bad_runtime_pin_names_its_glob() -> None:
    with pytest.raises(ValueError, match=r"pins\[0\] \('fc\*'\).*unknown compressor"):
        decide(200, pins=[("fc*", "zip")])


def test_backoff_moves_a_layer_to_a_lighter_option() -> None:
    eng = engine(200)
    layers = mlp_profile()
    before = eng.decide(layers, TIMING, AFTER_WARMUP, WORLD)
    name = "fc1.weight"
    order = [c.spec for c in eng.lightness_order(mlp_layer(name))]
    assert order[0] == "none"
    chosen = order.index(before.layer(name).spec)
    levels = len(order) - chosen  # forbid the chosen option and everything heavier
    after = eng.decide(layers, TIMING, AFTER_WARMUP, WORLD, backoff={name: levels})
    assert order.index(after.layer(name).spec) < chosen
    assert after.layer(name).reason.startswith(f"guard back-off by {levels} (excludes ")
    assert before.layer(name).spec in after.layer(name).reason
    # Other layers are re-optimized around it, never made heavier by the back-off itself.
    fully = eng.decide(layers, TIMING, AFTER_WARMUP, WORLD, backoff={name: 99})
    assert fully.layer(name).spec == "none"
    assert fully.layer(name).reason.startswith("guard back-off by 99")


def test_lightness_order_uses_priors() -> None:
    eng = engine(200)
    order = [c.spec for c in eng.lightness_order(mlp_layer("fc0.weight"))]
    assert order[:3] == ["none", "fp16:ef=false", "int8:chunk=256,ef=true"]
    assert order.index("powersgd:rank=16,ef=true") < order.index("powersgd:rank=1,ef=true")


def test_bad_backoff_level() -> None:
    with pytest.raises(ValueError, match="backoff"):
        decide(200, backoff={"fc0.weight": -1})


# ---- candidates, errors, costs -------------------------------------------------------------


def test_candidates_that_would_not_compress_are_skipped() -> None:
    rules = PolicyRules(candidates=("none", "fp16", "powersgd:rank=4"), min_numel=0)
    thin = LayerProfile(name="thin.weight", shape=(200_000, 3), grad_norm=1.0)
    half = LayerProfile(name="half.weight", shape=(512, 512), dtype=torch.float16, grad_norm=1.0)
    eng = engine(50, rules)
    assert [c.spec for c in eng.lightness_order(thin)] == ["none", "fp16:ef=true"]
    assert [c.spec for c in eng.lightness_order(half)] == ["none", "powersgd:rank=4,ef=true"]
    decision = eng.decide([thin, half], TIMING, AFTER_WARMUP, WORLD)
    assert decision.layer("thin.weight").spec == "fp16:ef=true"


def test_measured_error_overrides_prior() -> None:
    rules = PolicyRules(candidates=("none", "powersgd:rank=1", "topk:ratio=0.01"))
    base = LayerProfile(name="w", shape=(1024, 1024), grad_norm=1.0)
    timing = StepTiming(backward_seconds=0.1, hideable_seconds=0.05, step_seconds=0.2)
    eng = engine(200, rules)
    prior = eng.decide([base], timing, AFTER_WARMUP, WORLD).layers[0]
    assert prior.spec == "powersgd:rank=1,ef=true"  # prior 0.72 < top-k 0.79
    measured = LayerProfile(
        name="w", shape=(1024, 1024), grad_norm=1.0, rel_error={"topk:ratio=0.01": 0.1}
    )
    chosen = eng.decide([measured], timing, AFTER_WARMUP, WORLD).layers[0]
    assert chosen.spec == "topk:ratio=0.01,ef=true"
    assert chosen.predicted_error == pytest.approx(0.01)
    assert "rel. error 0.1;" in chosen.reason


def test_measured_errors_calibrate_unmeasured_siblings() -> None:
    """A layer that compresses worse than its priors say makes its unmeasured options look
    worse by the same factor (capped at 1): the same family's measurements decide, else the
    layer's other families' (only upwards, see test_measured_error_overrides_prior). So the
    plan does not hop to an option that only looks better because it was never measured."""
    priors = ErrorPriors()
    shape = torch.Size((1024, 1024))
    timing = StepTiming(backward_seconds=0.1, hideable_seconds=0.05, step_seconds=0.2)
    measured_rank4 = 0.9
    ratio = measured_rank4 / priors.rel_error(build_compressor("powersgd:rank=4"), shape)
    layer = LayerProfile(
        name="w", shape=shape, grad_norm=1.0, rel_error={"powersgd:rank=4": measured_rank4}
    )
    expected = {
        "powersgd:rank=16": priors.rel_error(build_compressor("powersgd:rank=16"), shape) * ratio,
        "powersgd:rank=1": 1.0,  # 0.72 x 1.58 would exceed dropping the gradient
        "topk:ratio=0.001": min(
            1.0, priors.rel_error(build_compressor("topk:ratio=0.001"), shape) * ratio
        ),
        "fp16": priors.rel_error(build_compressor("fp16"), shape) * ratio,
    }
    for spec, rel in expected.items():
        eng = engine(200, PolicyRules(candidates=("none", spec)))
        chosen = eng.decide([layer], timing, AFTER_WARMUP, WORLD).layers[0]
        assert chosen.spec == build_compressor(spec).spec
        assert chosen.predicted_error == pytest.approx(rel**2), spec
    # In use and measured, rank 4 keeps its place against its calibrated sibling rank 1.
    eng = engine(200, PolicyRules(candidates=("none", "powersgd:rank=4", "powersgd:rank=1")))
    current = {"w": "powersgd:rank=4,ef=true"}
    chosen = eng.decide([layer], timing, AFTER_WARMUP, WORLD, current=current).layers[0]
    assert chosen.spec == "powersgd:rank=4,ef=true", chosen.reason
    # A measured top-k of its own: PowerSGD's measurements no longer speak for top-k.
    both = LayerProfile(
        name="w",
        shape=shape,
        grad_norm=1.0,
        rel_error={"powersgd:rank=4": measured_rank4, "topk:ratio=0.01": 0.5},
    )
    topk_ratio = 0.5 / priors.rel_error(build_compressor("topk:ratio=0.01"), shape)
    eng = engine(200, PolicyRules(candidates=("none", "topk:ratio=0.001")))
    chosen = eng.decide([both], timing, AFTER_WARMUP, WORLD).layers[0]
    expected_topk = priors.rel_error(build_compressor("topk:ratio=0.001"), shape) * topk_ratio
    assert chosen.predicted_error == pytest.approx(expected_topk**2)


def test_error_priors_are_sane() -> None:
    priors = ErrorPriors()
    shape = torch.Size((1024, 1024))

    def prior(spec: str) -> float:
        return priors.rel_error(build_compressor(spec), shape)

    assert prior("none") == 0.0
    assert 0 < prior("fp16") < prior("bf16") < prior("int8") < prior("powersgd:rank=16")
    assert prior("topk:ratio=0.1") < prior("topk:ratio=0.01") < prior("topk:ratio=0.001") < 1
    assert prior("powersgd:rank=4") < prior("powersgd:rank=1")
    assert prior("qsgd:levels=64") < prior("qsgd:levels=16") < prior("qsgd:levels=4")
    assert prior("randomk:ratio=0.01") == pytest.approx(math.sqrt(99))
    assert priors.rel_error(build_compressor("powersgd:rank=8"), torch.Size((8, 100))) == 0.0


def test_overlap_arithmetic() -> None:
    decision = decide(200)
    layer_seconds = math.fsum(layer.predicted_seconds for layer in decision.layers)
    assert decision.predicted_comm_seconds == pytest.approx(
        decision.latency_seconds + layer_seconds
    )
    # 16M float32 parameters in 25 MiB buckets: 3 buckets, one all-reduce latency each.
    assert decision.buckets == 3
    assert decision.latency_seconds == pytest.approx(3 * 2 * (WORLD - 1) * ALPHA)
    assert decision.budget_seconds == pytest.approx(TIMING.hideable_seconds / TARGET)
    comm = decision.predicted_comm_seconds
    exposed = max(0.0, comm - TIMING.hideable_seconds)
    assert decision.predicted_exposed_seconds == pytest.approx(exposed)
    assert decision.predicted_overlap == pytest.approx(1 - exposed / comm)
    assert decision.predicted_wire_bytes == sum(x.predicted_wire_bytes for x in decision.layers)


def test_known_buckets_are_counted_exactly() -> None:
    layers = [
        LayerProfile(name=f"l{i}", shape=(512, 512), grad_norm=1.0, bucket=i % 2) for i in range(6)
    ]
    decision = engine(200).decide(layers, TIMING, AFTER_WARMUP, WORLD)
    assert decision.buckets == 2


def test_extra_collectives_pay_their_latency() -> None:
    eng = engine(200, PolicyRules(min_numel=0))
    layer = LayerProfile(name="w", shape=(1024, 1024), grad_norm=1.0)
    decision = eng.decide([layer], TIMING, AFTER_WARMUP, WORLD, pins=[("w", "topk")])
    wire = build_compressor("topk").wire_bytes(layer.shape, layer.dtype)
    expected = FakeCostModel(200).comm_seconds(Collective.ALL_GATHER, wire, WORLD)
    expected += _PER_ELEMENT["topk"] * layer.numel
    assert decision.layers[0].predicted_seconds == pytest.approx(expected)
    plain = eng.decide([layer], TIMING, AFTER_WARMUP, WORLD, pins=[("w", "none")])
    bandwidth_only = FakeCostModel(200).comm_seconds(Collective.ALL_REDUCE, layer.raw_bytes, WORLD)
    bandwidth_only -= FakeCostModel(200).comm_seconds(Collective.ALL_REDUCE, 0, WORLD)
    assert plain.layers[0].predicted_seconds == pytest.approx(bandwidth_only)


# ---- output ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mbit", [None, 50, 200, 1000, 40_000])
def test_every_layer_has_a_reason(mbit: float | None) -> None:
    decision = decide(mbit)
    assert [layer.name for layer in decision.layers] == [x.name for x in mlp_profile()]
    assert_reasons(decision)


def test_deterministic_and_json_friendly() -> None:
    first = decide(200)
    second = decide(200)
    assert first == second
    text = json.dumps(first.to_dict(), allow_nan=False)
    data = json.loads(text)
    assert data["feasible"] is first.feasible
    assert [layer["spec"] for layer in data["layers"]] == list(first.plan.values())
    assert data["layers"][0]["reason"] == first.layers[0].reason


def test_input_validation() -> None:
    eng = engine(200)
    with pytest.raises(ValueError, match="unique"):
        eng.decide(mlp_profile() * 2, TIMING, AFTER_WARMUP, WORLD)
    with pytest.raises(ValueError, match="world_size"):
        eng.decide(mlp_profile(), TIMING, AFTER_WARMUP, 0)
    with pytest.raises(ValueError, match="target_overlap"):
        PolicyEngine(PolicyRules(), FakeCostModel(200), target_overlap=1.5)
    with pytest.raises(ValueError, match="hideable_seconds"):
        StepTiming(backward_seconds=1.0, hideable_seconds=-1.0, step_seconds=1.0)
    with pytest.raises(ValueError, match="grad_norm"):
        LayerProfile(name="x", shape=(4,), grad_norm=math.nan)
    bad = LayerProfile(name="x", shape=(512, 512), grad_norm=1.0, rel_error={"zip": 0.1})
    with pytest.raises(ValueError, match="x: bad spec in rel_error"):
        engine(200, PolicyRules(min_numel=0)).decide([bad], TIMING, AFTER_WARMUP, WORLD)


def test_hysteresis_keeps_the_compressor_in_use_and_reports_true_numbers() -> None:
    """A layer's current compressor is favoured by ``switch_margin``; reported numbers stay true."""
    fresh = decide(200)
    current = {name: fresh.layer(name).runner_up for name in BIG}
    assert all(current.values())

    def with_margin(margin: float) -> object:
        cost = FakeCostModel(200)
        config = PolicyEngine.Config(switch_margin=margin)
        rules = load_policy("default")
        return PolicyEngine(rules, cost, target_overlap=TARGET, config=config).decide(
            mlp_profile(), TIMING, AFTER_WARMUP, WORLD, current=current
        )

    assert with_margin(0.0).plan == fresh.plan  # no margin: the plan in use changes nothing
    sticky = with_margin(0.99)  # an overwhelming margin: every layer keeps what it has
    for name in BIG:
        layer = sticky.layer(name)
        assert layer.spec == current[name]
        assert layer.predicted_seconds == pytest.approx(fresh.layer(name).runner_up_seconds)
        assert layer.predicted_error == pytest.approx(fresh.layer(name).runner_up_error)


# ---- bucket timeline -------------------------------------------------------------------------


def _two_buckets(hideable_last: float) -> tuple[list[LayerProfile], StepTiming]:
    """Two equal 4M-element weights: 'early' in bucket 0 (ready first), 'late' in bucket 1."""
    layers = [
        LayerProfile(name="early.weight", shape=(2048, 2048), grad_norm=1.0, bucket=0),
        LayerProfile(name="late.weight", shape=(2048, 2048), grad_norm=1.0, bucket=1),
    ]
    timing = StepTiming(
        backward_seconds=0.30,
        hideable_seconds=0.25,
        step_seconds=0.50,
        bucket_hideable_seconds={0: 0.25, 1: hideable_last},
    )
    return layers, timing


def test_the_last_bucket_cannot_hide_behind_the_backward_before_it() -> None:
    """At 10 Gbit/s both uncompressed weights (2 x 16 MB, ~20 ms each) fit in H = 250 ms,
    but the last bucket is ready when the backward ends: its 20 ms are exposed whatever H is.
    With the bucket timeline the engine sees that and compresses just that layer (min_gain 0:
    the gain, 4% of this step, is the next test's subject)."""
    rules = PolicyRules(candidates=("none", "fp16", "powersgd:rank=4"), min_gain=0.0)
    layers, timing = _two_buckets(hideable_last=0.0)
    eng = engine(10_000, rules)
    flat = StepTiming(backward_seconds=0.30, hideable_seconds=0.25, step_seconds=0.50)
    blind = eng.decide(layers, flat, AFTER_WARMUP, WORLD)
    assert set(blind.plan.values()) == {"none"} and blind.predicted_exposed_seconds == 0.0

    seen = eng.decide(layers, timing, AFTER_WARMUP, WORLD)
    assert seen.layer("early.weight").spec == "none"
    assert seen.layer("late.weight").spec != "none"
    assert seen.feasible
    slack = 0.25 * (1 - TARGET) / TARGET
    late = seen.layer("late.weight").predicted_seconds
    latency = seen.latency_seconds / seen.buckets
    # Exposure is the last bucket's time (its H is 0), within the target's slack.
    assert seen.predicted_exposed_seconds == pytest.approx(late + latency)
    assert seen.predicted_exposed_seconds <= slack
    assert seen.predicted_overlap >= TARGET


def test_compression_must_cut_the_step_by_min_gain() -> None:
    """The last bucket's 20 ms of exposure on a 500 ms step: compressing it gains 4% minus the
    compression work, under the default min_gain of 5%, so everything stays uncompressed and
    says why. On a 150 ms step the same plan gains over 10% and is taken; a plan in use keeps
    its place down to 85% of the threshold."""
    rules = PolicyRules(candidates=("none", "fp16", "powersgd:rank=4"))
    assert rules.min_gain == 0.05
    layers, timing = _two_buckets(hideable_last=0.0)
    eng = engine(10_000, rules)
    slow_step = eng.decide(layers, timing, AFTER_WARMUP, WORLD)
    assert set(slow_step.plan.values()) == {"none"}
    late = slow_step.layer("late.weight")
    assert late.rule == "no_gain" and late.reason.startswith("compression does not pay: ")
    assert "under min_gain 5%" in late.reason

    short = dataclasses.replace(timing, step_seconds=0.15)
    fast_step = eng.decide(layers, short, AFTER_WARMUP, WORLD)
    assert fast_step.layer("late.weight").spec != "none"
    assert fast_step.layer("late.weight").rule in ("knapsack", "infeasible")

    # A step on which the plan gains 4.5%: above 85% of 5% (in use), under 5% (fresh).
    chosen = fast_step.layer("late.weight").spec
    work = FakeCostModel(10_000).compress_seconds(build_compressor(chosen), layers[1].shape)
    saved = slow_step.predicted_exposed_seconds - fast_step.predicted_exposed_seconds - work
    gain_step = dataclasses.replace(timing, step_seconds=saved / 0.045)
    fresh = eng.decide(layers, gain_step, AFTER_WARMUP, WORLD)
    kept = eng.decide(layers, gain_step, AFTER_WARMUP, WORLD, current={"late.weight": chosen})
    assert fresh.layer("late.weight").spec == "none"
    assert kept.layer("late.weight").spec == chosen


def test_a_bucket_ready_early_enough_needs_no_compression() -> None:
    rules = PolicyRules(candidates=("none", "fp16", "powersgd:rank=4"))
    layers, timing = _two_buckets(hideable_last=0.1)  # 100 ms of backward after it
    decision = engine(10_000, rules).decide(layers, timing, AFTER_WARMUP, WORLD)
    assert set(decision.plan.values()) == {"none"}
    assert decision.feasible and decision.predicted_exposed_seconds == 0.0


def test_hysteresis_never_keeps_a_plan_that_misses_the_target() -> None:
    """The layer in use looks 15% cheaper to the optimizer; when that alone makes the plan
    fit, the plan is solved again at true costs (it kept fp16 at 2 Gbit/s on the LM)."""
    rules = PolicyRules(candidates=("none", "fp16", "powersgd:rank=4"))
    layers = [LayerProfile(name="w", shape=(2048, 2048), grad_norm=1.0)]
    eng = engine(2_000, rules)
    roomy = eng.decide(layers, TIMING, AFTER_WARMUP, WORLD)
    assert roomy.layer("w").spec == "none" and roomy.layer("w").runner_up == "fp16:ef=true"
    fp16_seconds = roomy.layer("w").runner_up_seconds
    assert fp16_seconds is not None
    # H such that fp16 misses the budget H / t by 10% at true cost but fits with the discount.
    hideable = (fp16_seconds + roomy.latency_seconds) * TARGET / 1.1
    timing = StepTiming(backward_seconds=0.3, hideable_seconds=hideable, step_seconds=0.5)
    kept = eng.decide(layers, timing, AFTER_WARMUP, WORLD, current={"w": "fp16:ef=true"})
    assert kept.layer("w").spec == "powersgd:rank=4,ef=true"
    assert kept.feasible
