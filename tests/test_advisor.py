"""The offline advisor (``autocomp-advisor``): what-if math, verdicts, files, and the CLI.

Tier 1 (in process, no torch.distributed): the ring all-reduce and all-gather times as the
world size grows; the bucket pipeline on a hand-made timeline; scaling efficiency; the verdict
flipping from "compress" to "does not pay" as the what-if bandwidth rises; corrupt, truncated
and other-version profiles and absurd what-if values rejected with exit status 2 and a one-line
message naming the problem; ``--plan-out`` files loadable by ``autocomp.plan.load_plan`` and
``CostModel.load``; ``report`` on a run log; output paths checked before any work (exit 2);
the model choice named when a profile has several; the capture's bookkeeping driven by hand
(fake DDP models and buckets): per-step compute time of a short run, steps of a GAN counted
once per iteration, gradients of parameters unused in the first step, autocomp's own hook
reporting to the capture's profiler (an adaptive one, which has its own, timed from outside);
``profile`` in process (``RANK=0``) on scripts that never reach DDP: ``sys.exit`` reasons,
syntax errors.

Tier 2 (``multirank``: spawns processes, small): ``profile examples/digits_cnn.py --steps 5``
on 2 local gloo ranks writes a valid profile (layer names and shapes of the model, a measured
link, the bucket timeline) and ``recommend`` renders it as terminal, JSON and HTML output; a
script that raises shows its traceback (exit 1, partial profile kept once a step was
captured); a script without DDP gets the wrapping snippet (exit 1); a failing rank 1's
traceback is shown as the likely root cause; a late ``sys.exit`` keeps a partial profile and
says why; a bare ``except:`` around the loop still gives a complete profile; a built-in comm
hook is reported as untimeable; a script wrapped by ``autocomp.wrap`` is measured through its
own hook.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autocomp import profiler
from autocomp import timing as timing_module
from autocomp.advisor import capture as capture_module
from autocomp.advisor import cli
from autocomp.advisor.capture import ModelCapture
from autocomp.advisor.costs import eligible
from autocomp.advisor.profile import (
    PROFILE_VERSION,
    BucketInfo,
    CompressorMeasurement,
    LayerInfo,
    LinkMeasurement,
    ModelProfile,
    Profile,
    ProfileError,
    ScriptInfo,
    Timing,
)
from autocomp.advisor.runner import ProfileRunner, smallest_preset_min_numel
from autocomp.advisor.session import CaptureSession, _StopScript
from autocomp.advisor.units import parse_bandwidth, parse_latency
from autocomp.advisor.whatif import (
    OPTIONS,
    TCP_ETHERNET_EFFICIENCY,
    Scenario,
    WhatIfModel,
    collective_seconds,
    simulate_pipeline,
)
from autocomp.compressors import Collective, build_compressor
from autocomp.cost_model import CostModel
from autocomp.hook import autocomp_hook
from autocomp.hook_state import HookState
from autocomp.link_model import LinkEstimate, link_bytes
from autocomp.plan import load_plan
from autocomp.policy.priors import ErrorPriors
from autocomp.policy.rules import PolicyRules, available_policies, load_policy

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
GBIT = 1e9 / 8


# ---- a hand-made profile ---------------------------------------------------------------------


def make_profile(*, link: bool = True) -> Profile:
    """A 4-layer model: one 1024x1024 weight (4 MB) dominates; costs as measured on a CPU."""
    layers = (
        LayerInfo(name="big.weight", shape=(1024, 1024), bucket=1, grad_norm=1.0),
        LayerInfo(name="big.bias", shape=(1024,), bucket=1, grad_norm=0.1),
        LayerInfo(name="head.weight", shape=(10, 1024), bucket=0, grad_norm=0.5),
        LayerInfo(name="head.bias", shape=(10,), bucket=0, grad_norm=0.05),
    )
    buckets = (
        BucketInfo(index=0, params=("head.bias", "head.weight"), bytes=41_000, ready_s=0.002),
        BucketInfo(index=1, params=("big.bias", "big.weight"), bytes=4_198_400, ready_s=0.030),
    )
    timing = Timing(
        steps_used=4,
        forward_s=0.020,
        backward_s=0.030,
        first_bucket_ready_s=0.002,
        last_bucket_ready_s=0.030,
        hideable_s=0.028,
        step_s=0.060,
        exposed_comm_s=0.001,
        hook_s=0.0005,
        compute_step_s=0.0585,
        rank_step_s=(0.060, 0.061),
    )
    costs = {
        "fp16:ef=false": (1.5e-3, 2e-4, 2.5e-4),
        "powersgd:rank=1": (1.0e-3, 2e-4, 0.72),
        "powersgd:rank=2": (1.1e-3, 2e-4, 0.65),
        "powersgd:rank=4": (1.2e-3, 2e-4, 0.57),
        "powersgd:rank=16": (1.6e-3, 2e-4, 0.48),
        "topk:ratio=0.01": (6e-3, 3e-4, 0.79),
        "topk:ratio=0.001": (3e-3, 3e-4, 0.93),
        "int8": (4e-3, 1.2e-3, 0.013),
    }
    measurements = []
    for spec, (local, decode, error) in costs.items():
        compressor = build_compressor(spec)
        measurements.append(
            CompressorMeasurement(
                spec=compressor.spec,
                shape=(1024, 1024),
                collective=compressor.collective.value,
                wire_bytes=compressor.wire_bytes(torch.Size((1024, 1024)), torch.float32),
                local_s=local,
                decode_s=decode,
                reps=5,
                rel_error=error,
            )
        )
    return Profile(
        created="2026-11-22T00:00:00+00:00",
        complete=True,
        status="stopped after 5 steps",
        script=ScriptInfo(path="train.py", steps_requested=5, steps_captured=5),
        world_size=2,
        models=(
            ModelProfile(
                index=0, module_class="Net", layers=layers, buckets=buckets, timing=timing
            ),
        ),
        link=LinkMeasurement(
            latency_s=50e-6,
            bandwidth_bytes_per_s=1.0e9,
            rel_residual=0.05,
            method="test",
            world_size=2,
            samples=((1024, 1e-4), (4 << 20, 5e-3)),
        )
        if link
        else None,
        compressors=tuple(measurements),
        compressor_budget_s=5.0,
    )


@pytest.fixture(scope="module")
def whatif() -> WhatIfModel:
    return WhatIfModel(make_profile())


def scenario(gbit: float, world: int = 8, latency: float = 10e-6) -> Scenario:
    return Scenario(bandwidth_bytes_per_s=gbit * GBIT, latency_s=latency, world_size=world)


# ---- tier 1: the math ------------------------------------------------------------------------


def test_ring_allreduce_time_grows_with_world_size_as_the_alpha_beta_model_says() -> None:
    link = LinkEstimate(latency_s=1e-4, bandwidth_bytes_per_s=1e9, samples=1, rel_residual=0)
    payload = 100_000_000
    times = {}
    for n in (2, 4, 8, 64, 1024):
        expected = 2 * (n - 1) * 1e-4 + 2 * (n - 1) / n * payload / 1e9
        times[n] = collective_seconds(Collective.ALL_REDUCE, payload, n, link)
        assert times[n] == pytest.approx(expected, rel=1e-12)
        gather = collective_seconds(Collective.ALL_GATHER, payload, n, link)
        assert gather == pytest.approx((n - 1) * 1e-4 + (n - 1) * payload / 1e9, rel=1e-12)
    assert times[2] < times[4] < times[8] < times[64] < times[1024]
    # The bandwidth term saturates at 2x the payload; only latency keeps growing.
    assert times[64] - 126 * 1e-4 < 2 * payload / 1e9
    assert times[1024] - times[64] == pytest.approx(
        (2046 - 126) * 1e-4 + (2 * 1023 / 1024 - 2 * 63 / 64) * payload / 1e9
    )


def test_payload_efficiency_scales_the_wire_rate_not_the_latency() -> None:
    # tbf and real NICs count whole frames: at 95.6% payload a 10 Gbit/s link moves
    # collective bytes like a 9.56 Gbit/s one, with the same per-hop latency.
    line = Scenario(
        bandwidth_bytes_per_s=10 * GBIT,
        latency_s=1e-4,
        world_size=8,
        payload_efficiency=TCP_ETHERNET_EFFICIENCY,
    )
    goodput = scenario(10 * TCP_ETHERNET_EFFICIENCY, latency=1e-4)
    assert line.link.bandwidth_bytes_per_s == pytest.approx(goodput.link.bandwidth_bytes_per_s)
    assert line.link.latency_s == goodput.link.latency_s
    assert abs(TCP_ETHERNET_EFFICIENCY - 0.956) < 1e-3
    for bad in (0.0, -0.5, 1.01, math.nan):
        with pytest.raises(ValueError, match="payload efficiency"):
            Scenario(bandwidth_bytes_per_s=GBIT, latency_s=0, world_size=2, payload_efficiency=bad)


def test_pipeline_on_a_hand_made_timeline() -> None:
    # Three buckets ready at 0, 1, 2 s; each needs 1.5 s on the link: the link is the
    # bottleneck, so comm runs back to back: 0-1.5, 1.5-3, 3-4.5; backward ends at 2.
    pipe = simulate_pipeline([0.0, 1.0, 2.0], [1.5, 1.5, 1.5])
    assert pipe.exposed_s == pytest.approx(2.5)  # the link ends at 4.5, the backward at 2
    assert pipe.added_s == pytest.approx(2.5)
    assert pipe.overlap == pytest.approx(1 - 2.5 / 4.5)
    # A fast link hides all but the last bucket's collective.
    fast = simulate_pipeline([0.0, 1.0, 2.0], [0.1, 0.1, 0.1])
    assert fast.exposed_s == pytest.approx(0.1)
    # Compression work delays the backward (same thread), then the collectives. An earlier
    # bucket's decode is counted at its hook call (on a CPU it shares the backward's cores),
    # the last bucket's follows its collectives, as the engine places them.
    work = simulate_pipeline([0.0, 1.0], [0.5, 0.5], local=[0.2, 0.2], decode=[0.1, 0.1])
    # bucket 0: available 0.3, link 0.3-0.8; bucket 1: ready 1.0 + 0.3 + 0.2 = 1.5, link
    # 1.5-2.0, its decode 2.0-2.1; the backward ends at 1.5
    assert work.work_s == pytest.approx(0.6)
    assert work.added_s == pytest.approx(1.1)
    assert work.exposed_s == pytest.approx(0.5)
    # PowerSGD in the last bucket behind 0.5 s of the first's traffic: its first round (0.1)
    # waits for the link, then its final round is computed (0.1) and sent (0.1).
    rounds = simulate_pipeline(
        [0.0, 0.2],
        [0.5, 0.2],
        local=[0.0, 0.2],
        rounds=[(0.0, 0.0), (0.1, 0.1)],
        final_work=[0.0, 0.1],
    )
    # bucket 1: ready 0.2, encodes until 0.3, first round 0.5-0.6, final work 0.6-0.7, final
    # round 0.7-0.8: added 0.8 - 0.2
    assert rounds.added_s == pytest.approx(0.6)
    assert rounds.exposed_s == pytest.approx(0.6 - 0.2)
    with pytest.raises(ValueError, match="one entry per bucket"):
        simulate_pipeline([0.0], [0.1], rounds=[])
    with pytest.raises(ValueError, match="non-decreasing"):
        simulate_pipeline([1.0, 0.0], [0.1, 0.1])


def test_efficiency_is_compute_step_over_predicted_step(whatif: WhatIfModel) -> None:
    evaluation = whatif.evaluate(scenario(1.0))
    compute = whatif.model.timing.compute_step_s
    none = evaluation.result("none")
    for result in evaluation.results:
        assert result.step_s == pytest.approx(compute + result.compress_s + result.exposed_s)
        assert result.efficiency == pytest.approx(compute / result.step_s)
        assert result.speedup == pytest.approx(none.step_s / result.step_s)
    # 4.2 MB over a 1 Gbit/s ring of 8: ~59 ms of wire time, mostly exposed.
    wire = 2 * 7 / 8 * 4_239_400 / GBIT
    assert none.comm_s == pytest.approx(wire + 2 * 14 * 10e-6, rel=1e-3)
    assert none.efficiency < 0.6
    # At 400 Gbit/s with no latency, uncompressed scaling is nearly perfect.
    ideal = whatif.evaluate(scenario(400.0, latency=0.0)).result("none")
    assert ideal.efficiency > 0.99


def test_uniform_options_leave_small_and_1d_layers_alone(whatif: WhatIfModel) -> None:
    plan = whatif.uniform_plan("powersgd:rank=4")
    assert plan["big.weight"].startswith("powersgd:rank=4")
    # head.weight (10,240 elements) is above the default min_numel (4,096): compressed too.
    assert plan["head.weight"].startswith("powersgd:rank=4")
    assert plan["big.bias"] == plan["head.bias"] == "none"
    small = WhatIfModel(make_profile(), config=WhatIfModel.Config(policy=SMALL_HEAD_RULES))
    assert small.uniform_plan("powersgd:rank=4")["head.weight"] == "none"


SMALL_HEAD_RULES = PolicyRules(min_numel=16384)
"""A policy under which head.weight is too small to compress (as the default was until
min_numel went to 4096): the verdict scenarios below are about the big layer alone."""


def test_verdict_flips_from_compress_to_not_as_bandwidth_rises(whatif: WhatIfModel) -> None:
    slow = whatif.verdict(whatif.evaluate(scenario(0.01)))
    assert slow.kind == "compress"
    assert slow.headline.startswith("compress with")
    assert slow.option is not None and slow.option != "none"
    fast = whatif.verdict(whatif.evaluate(scenario(400.0)))
    assert fast.kind == "do_not_compress"
    assert "does not pay" in fast.headline and "FSDP/ZeRO" in fast.headline
    assert fast.top_layers[0][0] == "big.weight" and fast.top_layers[0][2] > 0.95
    kinds = [whatif.verdict(whatif.evaluate(scenario(10 ** (k / 4)))).kind for k in range(-8, 11)]
    first_off = kinds.index("do_not_compress")
    assert "compress" not in kinds[first_off:], kinds  # one flip, no flapping back
    assert kinds[0] == "compress"


def test_a_compression_that_does_not_buy_back_its_error_is_not_recommended(
    whatif: WhatIfModel,
) -> None:
    """The verdict holds its choice to the policy's error_cost, as the engine does: PowerSGD
    shortening the step by ~60% is recommended at the default cost (0.33: the adaptive plan,
    rank 16 on the big layer, 3 ms slower than rank 4 and more accurate). When each unit of
    squared error is said to cost 3 steps' worth of progress, the choice moves to the plan
    that learns most per second (the near-lossless adaptive plan, fp16 on the big layer, 45%
    faster than uncompressed), and PowerSGD alone is no longer recommended."""
    big_only = WhatIfModel(make_profile(), config=WhatIfModel.Config(policy=SMALL_HEAD_RULES))
    cheap = big_only.evaluate(scenario(0.56))
    default = big_only.verdict(cheap)
    assert default.kind == "compress"
    assert cheap.result(default.option).plan["big.weight"].startswith("powersgd")
    costly_rules = PolicyRules(error_cost=3.0, min_numel=16384)
    costly = WhatIfModel(make_profile(), config=WhatIfModel.Config(policy=costly_rules))
    evaluation = costly.evaluate(scenario(0.56))
    lossless = costly.verdict(evaluation)
    # fp16 without error feedback (the policy's fp16) on the big layer: the adaptive plan's
    # own choice, so the uniform fp16 row is the same plan (and comes first).
    assert lossless.kind == "compress" and lossless.option in ("fp16", "adaptive")
    assert evaluation.result(lossless.option).plan == evaluation.result("adaptive").plan
    assert evaluation.result("adaptive").progress > 0.99
    assert evaluation.result("powersgd-r4").progress < 0.3
    assert any("learns less per second" in r for r in lossless.reasons)
    options = tuple(o for o in OPTIONS if o.key in ("none", "powersgd-r4"))
    psgd_only = WhatIfModel(
        make_profile(), config=WhatIfModel.Config(policy=costly_rules, options=options)
    )
    verdict = psgd_only.verdict(psgd_only.evaluate(scenario(0.56)))
    assert verdict.kind == "in_between"
    assert any("of per-step progress its error costs" in r for r in verdict.reasons)
    assert "does not buy back what the error costs" in verdict.reasons[-1]


def test_errors_in_use_floor_low_rank_and_sparse_measurements_not_quantizers() -> None:
    """A short profile measures PowerSGD and top-k on one fresh gradient, far below their
    error in use under error feedback (rank 4 on the LSTM LM: 0.04 at step 0, 0.90 in use),
    so the what-if plans with the in-use prior where the measurement is lower. int8's error
    does not depend on the history and is taken as measured."""
    priors = ErrorPriors()
    shape = torch.Size((1024, 1024))
    rank4, topk, int8 = (build_compressor(s) for s in ("powersgd:rank=4", "topk", "int8"))
    assert priors.in_use(rank4, shape, 0.04) == pytest.approx(priors.rel_error(rank4, shape))
    assert priors.in_use(rank4, shape, 0.99) == 0.99  # a worse measurement stands
    assert priors.in_use(topk, shape, 0.3) == pytest.approx(priors.rel_error(topk, shape))
    assert priors.in_use(int8, shape, 0.006) == 0.006
    # The table's error column and the engine behind the adaptive plan see the same numbers.
    model = WhatIfModel(make_profile())
    big = model.layers["big.weight"]
    measured = model.profile.measurement(rank4.spec, big.shape)
    assert measured is not None and measured.rel_error == pytest.approx(0.57)
    in_use = model.rel_error("powersgd:rank=4", big)
    assert in_use > 0.57
    assert in_use == pytest.approx(priors.rel_error(rank4, torch.Size(big.shape)))
    (profile,) = [p for p in model.layer_profiles() if p.name == "big.weight"]
    assert profile.rel_error[rank4.spec] == pytest.approx(in_use)
    assert model.rel_error("int8", big) == pytest.approx(0.013)


def test_the_verdict_advises_only_what_the_policy_could_run(whatif: WhatIfModel) -> None:
    """At 10 Mbit/s uniform PowerSGD rank 1 predicts the shortest step, but the default
    preset leaves it out (it learned less per second in training): the verdict names it and
    advises the adaptive plan. A policy that offers rank 1 may be advised rank 1."""
    evaluation = whatif.evaluate(scenario(0.01))
    fastest = min(evaluation.results, key=lambda r: r.step_s)
    assert fastest.key == "powersgd-r1"
    verdict = whatif.verdict(evaluation)
    assert verdict.kind == "compress" and verdict.option == "adaptive"
    assert any(
        r.startswith("PowerSGD rank 1 predicts a shorter step") and "not among" in r
        for r in verdict.reasons
    ), verdict.reasons
    rank1_rules = PolicyRules(candidates=("none", "powersgd:rank=1", "powersgd:rank=4"))
    offering = WhatIfModel(make_profile(), config=WhatIfModel.Config(policy=rank1_rules))
    chosen = offering.verdict(offering.evaluate(scenario(0.01)))
    assert chosen.kind == "compress" and chosen.option == "powersgd-r1"
    assert not any("not among" in r for r in chosen.reasons)


def test_the_verdicts_band_of_equally_fast_options_is_the_policys_time_slack() -> None:
    """The verdict's near-best band is the engine's ``time_slack``, not a number of its own.
    With rank 1 offered at 100 Mbit/s, rank 4 is 8.5% slower: outside the default 3% band
    (rank 1, the fastest, is chosen), inside a 10% one (rank 4, less error, is chosen). At
    ``error_cost`` 0.05 the difference in error is worth less than the 8.5%, so the band alone
    decides (at the default cost rank 4 learns more per second than rank 1 either way)."""
    candidates = ("none", "powersgd:rank=1", "powersgd:rank=4")
    options = tuple(o for o in OPTIONS if o.key in ("none", "powersgd-r1", "powersgd-r4"))
    choices = {}
    for slack in (0.03, 0.10):
        rules = PolicyRules(candidates=candidates, time_slack=slack, error_cost=0.05)
        model = WhatIfModel(
            make_profile(), config=WhatIfModel.Config(policy=rules, options=options)
        )
        assert model.near_best == slack
        evaluation = model.evaluate(scenario(0.1))
        ratio = evaluation.result("powersgd-r4").step_s / evaluation.result("powersgd-r1").step_s
        assert 1.03 < ratio < 1.10
        choices[slack] = model.verdict(evaluation).option
    assert choices == {0.03: "powersgd-r1", 0.10: "powersgd-r4"}
    with pytest.raises(ValueError, match="near_best"):
        WhatIfModel.Config(near_best=1.5)


def _with_sparse_embedding(sparse_bytes: int = 300_000) -> Profile:
    """``make_profile`` plus a 100000x64 embedding with ``sparse=True`` (25.6 MB dense), alone
    in its bucket, whose steps touched ``sparse_bytes`` of rows and indices per rank."""
    profile = make_profile()
    (model,) = profile.models
    emb = LayerInfo(
        name="emb.weight", shape=(100_000, 64), bucket=2, grad_norm=0.2, sparse_bytes=sparse_bytes
    )
    bucket = BucketInfo(index=2, params=("emb.weight",), bytes=25_600_000, ready_s=0.029)
    model = dataclasses.replace(
        model, layers=(*model.layers, emb), buckets=(*model.buckets, bucket)
    )
    return dataclasses.replace(profile, models=(model,))


def test_a_sparse_gradient_is_sent_as_ddp_sends_it_and_never_compressed() -> None:
    """An embedding with ``sparse=True`` is never compressed (``wrap`` refuses to), and its
    traffic is gloo's sparse all-reduce: every rank's rows and indices gathered, not its dense
    25.6 MB summed. The what-if, the adaptive plan, the byte ranking and the profile file
    all say so."""
    dense = WhatIfModel(make_profile())
    model = WhatIfModel(_with_sparse_embedding())
    assert model.layers["emb.weight"].sparse and not model.eligible(model.layers["emb.weight"])
    assert model.uniform_plan("powersgd:rank=4")["emb.weight"] == "none"
    slow = scenario(0.05)
    evaluation = model.evaluate(slow)
    assert evaluation.result("adaptive").plan["emb.weight"] == "none"
    assert evaluation.result("adaptive").plan["big.weight"] != "none"
    none_plan = model.uniform_plan("none")
    _, _, sent = model.simulate(none_plan, slow)
    _, _, sent_dense = dense.simulate(dense.uniform_plan("none"), slow)
    assert sent - sent_dense == pytest.approx(link_bytes(Collective.ALL_GATHER, 300_000, 8))
    top = dict((name, size) for name, size, _ in model.top_layers())
    assert top["emb.weight"] == 300_000 and model.model.total_bytes < 5_000_000
    # The profile file keeps the field; dense layers leave it out; bad values are refused.
    layer = model.layers["emb.weight"]
    assert LayerInfo.from_dict(layer.to_dict(), "layer").sparse_bytes == 300_000
    assert "sparse_bytes" not in model.layers["big.weight"].to_dict()
    with pytest.raises(ProfileError, match="sparse_bytes"):
        LayerInfo.from_dict({**layer.to_dict(), "sparse_bytes": -1}, "layer")


def test_a_row_sparse_dense_gradient_prices_top_k_on_its_nonzeros() -> None:
    """A dense embedding table whose profiled gradient was 0.6% nonzero: the what-if prices
    top-1% on it at no error (it sends every nonzero), as the adaptive engine does, while a
    table profiled before the share was recorded keeps the dense prior. The profile file
    keeps the field only when it is below 1, and refuses values outside [0, 1]."""
    profile = make_profile()
    (model,) = profile.models
    table = LayerInfo(name="table.weight", shape=(131_072, 64), bucket=2, grad_norm=0.2)
    bucket = BucketInfo(index=2, params=("table.weight",), bytes=33_554_432, ready_s=0.029)
    dense = dataclasses.replace(
        model, layers=(*model.layers, table), buckets=(*model.buckets, bucket)
    )
    sparse_table = dataclasses.replace(table, nonzero_share=0.006)
    sparse = dataclasses.replace(dense, layers=(*model.layers, sparse_table))
    errors = {}
    for key, variant in (("dense", dense), ("sparse", sparse)):
        whatif = WhatIfModel(dataclasses.replace(profile, models=(variant,)))
        errors[key] = whatif.rel_error("topk:ratio=0.01", whatif.layers["table.weight"])
    assert errors == {"dense": pytest.approx(0.95), "sparse": 0.0}
    assert "nonzero_share" not in table.to_dict()
    assert LayerInfo.from_dict(sparse_table.to_dict(), "layer").nonzero_share == 0.006
    with pytest.raises(ProfileError, match="nonzero_share"):
        LayerInfo.from_dict({**table.to_dict(), "nonzero_share": 1.5}, "layer")


def test_a_profiled_l1_norm_weighs_the_layer_and_round_trips() -> None:
    """Under ``error_weight = "grad_l1"`` the what-if weighs a layer by the L1 norm the
    profile recorded, as the engine weighs a measured one; a profile without it (recorded
    before the field) falls back to the estimate sqrt(numel) x L2. The file keeps the field
    only when present and refuses a negative one."""
    profile = make_profile()
    (model,) = profile.models
    big = model.layer("big.weight")
    estimate = math.sqrt(big.numel) * big.grad_norm
    plan = {"big.weight": "powersgd:rank=4"}

    def plan_progress(l1: float | None) -> float:
        layers = tuple(
            dataclasses.replace(layer, grad_l1=l1) if layer.name == "big.weight" else layer
            for layer in model.layers
        )
        variant = dataclasses.replace(model, layers=layers)
        return WhatIfModel(dataclasses.replace(profile, models=(variant,))).plan_progress(plan)

    assert plan_progress(None) == pytest.approx(plan_progress(estimate), rel=1e-12)
    # A tenth of the estimate: that layer's error counts for less against the other layers.
    assert plan_progress(0.1 * estimate) > plan_progress(estimate)
    layer = dataclasses.replace(big, grad_l1=12.5)
    assert "grad_l1" not in big.to_dict()
    assert LayerInfo.from_dict(layer.to_dict(), "layer").grad_l1 == 12.5
    with pytest.raises(ProfileError, match="grad_l1"):
        LayerInfo.from_dict({**layer.to_dict(), "grad_l1": -1.0}, "layer")


def test_adaptive_plan_comes_from_the_policy_engine(whatif: WhatIfModel) -> None:
    slow = whatif.evaluate(scenario(0.1))
    assert slow.decision is not None
    assert slow.decision.policy == "default"
    plan = slow.result("adaptive").plan
    assert plan["big.weight"] != "none"  # compressed on a slow link
    assert plan["big.bias"] == "none"  # 1-D: a rule, not the optimizer
    fast = whatif.evaluate(scenario(100.0))
    assert all(spec == "none" for spec in fast.result("adaptive").plan.values())


def test_the_what_if_prices_a_layer_powersgd_would_send_whole_as_none() -> None:
    """A plan with PowerSGD on the biases runs them as 'none' in the hook
    (``effective_compressor``); the what-if prices them so: the same timeline and bytes as
    the plan that says 'none'."""
    link = scenario(0.05, world=2)
    matrices = {"big.weight": "powersgd:rank=4", "head.weight": "powersgd:rank=4"}
    everywhere = {**matrices, "big.bias": "powersgd:rank=4", "head.bias": "powersgd:rank=4"}
    plain = make_profile()
    # bf16 gradients: 'none' sends the biases in bf16, PowerSGD's own path in float32.
    (model,) = plain.models
    layers = tuple(dataclasses.replace(x, dtype="bfloat16") for x in model.layers)
    half = dataclasses.replace(plain, models=(dataclasses.replace(model, layers=layers),))
    for profile in (plain, half):
        whatif = WhatIfModel(profile)
        assert whatif.simulate(everywhere, link) == whatif.simulate(matrices, link)


def test_the_what_if_prices_the_machines_contention_and_half_sums() -> None:
    """Measured contention stretches the backward beside hidden transfers, and a measured
    half-sum cost makes an fp16 all-reduce dearer than its bytes, in the advisor's plan
    timeline as in the controller's engine (one exposure model). Older profiles without
    them read as unmeasured; bad values are refused naming the field."""
    plain = make_profile()
    assert plain.link is not None
    machine = dataclasses.replace(
        plain,
        link=dataclasses.replace(
            plain.link,
            contention_seconds_per_byte=2e-9,
            half_sum_seconds_per_element=(("bfloat16", 0.0), ("float16", 5e-9)),
        ),
    )
    link = scenario(1.0, world=2)
    fp16 = {"big.weight": "fp16", "head.weight": "fp16"}
    base, priced = WhatIfModel(plain), WhatIfModel(machine)
    assert priced.cost_model(2).contention_seconds_per_byte == 2e-9
    none_plain, _, _ = base.simulate({}, link)
    none_priced, _, _ = priced.simulate({}, link)
    assert none_priced.added_s > none_plain.added_s  # the 4 MB transfer beside the backward
    fp16_plain, _, _ = base.simulate(fp16, link)
    fp16_priced, _, _ = priced.simulate(fp16, link)
    # On top of its share of contention, 1M halves summed at 5 ns each: about 5 ms.
    assert fp16_priced.added_s - fp16_plain.added_s > 4e-3

    data = machine.link.to_dict()  # type: ignore[union-attr]
    assert LinkMeasurement.from_dict(data, "link") == machine.link
    old = {k: v for k, v in data.items() if k not in _MACHINE_KEYS}
    read = LinkMeasurement.from_dict(old, "link")
    assert read.contention_seconds_per_byte == 0.0 and read.half_sum_seconds_per_element == ()
    with pytest.raises(ProfileError, match="contention_seconds_per_byte"):
        LinkMeasurement.from_dict({**data, "contention_seconds_per_byte": -1.0}, "link")
    with pytest.raises(ProfileError, match="'float32' is not one of float16, bfloat16"):
        LinkMeasurement.from_dict({**data, "half_sum_seconds_per_element": {"float32": 0}}, "l")
    with pytest.raises(ProfileError, match="finite"):
        bad = {"float16": float("inf")}
        LinkMeasurement.from_dict({**data, "half_sum_seconds_per_element": bad}, "link")


_MACHINE_KEYS = ("contention_seconds_per_byte", "half_sum_seconds_per_element")


def test_units_parse_and_reject() -> None:
    assert parse_bandwidth("10Gbit") == pytest.approx(1.25e9)
    assert parse_bandwidth("10 Gbit/s") == parse_bandwidth("10Gbps") == parse_bandwidth("10Gb/s")
    assert parse_bandwidth("1.25GB/s") == pytest.approx(1.25e9)
    assert parse_bandwidth("50Mbit") == pytest.approx(6.25e6)
    assert parse_latency("2ms") == pytest.approx(2e-3)
    assert parse_latency("50us") == pytest.approx(5e-5)
    for bad in ("0Gbit", "-1Gbit", "10 parsecs", "10", "1e9Tbit", "fast"):
        with pytest.raises(ValueError):
            parse_bandwidth(bad)
    for bad in ("-1ms", "3", "2 fortnights"):
        with pytest.raises(ValueError):
            parse_latency(bad)


# ---- tier 1: files and the CLI ---------------------------------------------------------------


def recommend(path: Path, *extra: str) -> int:
    return cli.main(["recommend", str(path), "--bandwidth", "1Gbit", "--world-size", "8", *extra])


def test_profile_round_trips(tmp_path: Path) -> None:
    profile = make_profile()
    path = tmp_path / "profile.json"
    profile.save(path)
    data = json.loads(path.read_text())
    assert next(iter(data)) == "autocomp_profile_version"
    assert data["autocomp_profile_version"] == PROFILE_VERSION
    assert Profile.load(path) == profile


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{this is not json", "not valid JSON"),
        ("", "empty file"),
        ("[1, 2, 3]", "not a profile"),
        ('{"hello": 1}', "not an autocomp profile"),
    ],
)
def test_bad_profiles_exit_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, reason: str
) -> None:
    path = tmp_path / "bad-profile.json"
    path.write_text(content)
    assert recommend(path) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(path) in err and reason in err


def test_truncated_and_other_version_profiles_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.json"
    make_profile().save(good)
    text = good.read_text()
    truncated = tmp_path / "truncated.json"
    truncated.write_text(text[: len(text) // 2])
    assert recommend(truncated) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "truncated.json" in err and "truncated" in err

    newer = tmp_path / "newer.json"
    data = json.loads(text)
    data["autocomp_profile_version"] = 2
    newer.write_text(json.dumps(data))
    assert recommend(newer) == 2
    err = capsys.readouterr().err.strip()
    assert "newer.json" in err and "version 2 is not supported" in err

    broken = tmp_path / "broken.json"
    del data["models"][0]["timing"]["step_s"]
    data["autocomp_profile_version"] = 1
    broken.write_text(json.dumps(data))
    assert recommend(broken) == 2
    err = capsys.readouterr().err.strip()
    assert "broken.json" in err and "step_s" in err

    assert recommend(tmp_path / "missing.json") == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(ProfileError, match="no such file"):
        Profile.load(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--bandwidth", "0Gbit", "must be > 0"),
        ("--bandwidth", "-10Gbit", "must be > 0"),
        ("--bandwidth", "10 parsecs", "unknown unit 'parsecs'"),
        ("--bandwidth", "10", "needs a unit"),
        ("--world-size", "-64", "world size must be >= 2"),
        ("--world-size", "eight", "must be an integer"),
        ("--latency", "-2ms", "latency must be >= 0"),
        ("--target-overlap", "1.5", "target overlap must be in (0, 1]"),
        ("--payload-efficiency", "0", "payload efficiency must be in (0, 1]"),
        ("--payload-efficiency", "1.2", "payload efficiency must be in (0, 1]"),
    ],
)
def test_absurd_what_if_values_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    path = tmp_path / "profile.json"
    make_profile().save(path)
    args = {"--bandwidth": "10Gbit", "--world-size": "8"}
    args[flag] = value
    argv = ["recommend", str(path)]
    for key, item in args.items():
        argv += [f"{key}={item}"] if item.startswith("-") else [key, item]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and message in err


def test_recommend_writes_json_html_and_a_loadable_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile_path = tmp_path / "profile.json"
    make_profile().save(profile_path)
    out, page, plan_path = tmp_path / "a.json", tmp_path / "a.html", tmp_path / "plan.json"
    code = cli.main(
        [
            "recommend",
            str(profile_path),
            "--bandwidth",
            "50Mbit",
            "--world-size",
            "8",
            "--json",
            str(out),
            "--html",
            str(page),
            "--plan-out",
            str(plan_path),
            "--sweep-points",
            "9",
        ]
    )
    assert code == 0
    terminal = capsys.readouterr().out
    assert "What if: 50 Mbit/s" in terminal and "compress with" in terminal
    advice = json.loads(out.read_text())
    assert advice["verdict"]["kind"] == "compress"
    assert [o["key"] for o in advice["options"]][:2] == ["none", "fp16"]
    assert len(advice["sweep"]["bandwidth_bytes_per_s"]) == 9
    assert advice["sweep"]["bandwidth_bytes_per_s"][0] * 8 == pytest.approx(10e6)
    assert advice["sweep"]["bandwidth_bytes_per_s"][-1] * 8 == pytest.approx(400e9)
    html = page.read_text()
    assert html.count("<svg") == 2 and "<script" not in html and "<link" not in html
    assert "compress with" in html

    plan = load_plan(plan_path)
    names = ["big.weight", "big.bias", "head.weight", "head.bias"]
    resolved = plan.resolve(names)
    chosen = advice["verdict"]["option"]
    option = next(o for o in advice["options"] if o["key"] == chosen)
    assert resolved["big.weight"].name != "none" and option["compressed_layers"] >= 1
    assert resolved["big.bias"].name == "none"
    assert plan.unmatched_patterns(names) == []
    costs = CostModel.load(tmp_path / "plan.cost.json")
    assert costs.config.world_size == 8
    assert costs.bandwidth_bytes_per_s is None  # no link: the job measures its own
    spec = build_compressor("powersgd:rank=4")
    # Direct evidence: the profile's measurement (all-reduce: one decode) is what it predicts.
    assert costs.compress_seconds(spec, (1024, 1024)) == pytest.approx(1.2e-3 + 2e-4)


def test_recommend_without_a_measured_link_uses_the_default_latency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "profile.json"
    make_profile(link=False).save(path)
    assert recommend(path) == 0
    assert "50 us default" in capsys.readouterr().out


def test_report_summarizes_a_run_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autocomp.runlog import RunLog

    meta = {
        "world_size": 2,
        "policy": "default",
        "target_overlap": 0.9,
        "window": 10,
        "layers": [{"name": "fc.weight", "shape": [4, 4], "numel": 16, "dtype": "float32"}],
    }
    log = RunLog.open(tmp_path / "run", run_id="test-run", meta=meta)
    for step in range(0, 100, 10):
        rate = 1.25e8 if step < 50 else 6.25e6
        log.append_window(
            {
                "step": step,
                "bandwidth_bytes_per_s": rate,
                "latency_s": 5e-5,
                "step_seconds": 0.1,
                "exposed_seconds": 0.01,
                "measured_overlap": 0.9,
                "predicted_overlap": 0.95,
                "bytes_per_step": 1000.0,
                "uncompressed_bytes_per_step": 4000.0,
                "loss": 2.0 - step / 100,
                "changes": {"fc.weight": ["none", "fp16"]} if step == 50 else {},
                "guard_events": [],
                "decision": {
                    "layers": [
                        {"name": "fc.weight", "spec": "fp16", "reason": "knapsack", "rule": "k"}
                    ]
                },
            }
        )
    log.close()
    summary_path = tmp_path / "summary.json"
    assert cli.main(["report", str(tmp_path / "run"), "--json", str(summary_path)]) == 0
    out = capsys.readouterr().out
    assert "run test-run" in out and "10 windows" in out and "1 Gbit/s -> 50 Mbit/s" in out
    summary = json.loads(summary_path.read_text())
    assert summary["plan_changes"] == 1
    assert summary["compression_ratio"]["median"] == pytest.approx(4.0)
    assert summary["current_plan"][0]["spec"] == "fp16"
    assert cli.main(["report", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nowhere" in err


@pytest.mark.parametrize(
    ("option", "target", "message"),
    [
        ("--json", "existing_dir", "--json: existing_dir is a directory"),
        ("--html", "nodir/x.html", "--html: directory"),
        ("--plan-out", "nodir/plan.json", "--plan-out: directory"),
    ],
)
def test_recommend_checks_its_output_paths_first(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    option: str,
    target: str,
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing_dir").mkdir()
    make_profile().save(tmp_path / "profile.json")
    assert recommend(tmp_path / "profile.json", option, target) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing computed or rendered before the error
    assert len(captured.err.strip().splitlines()) == 1 and message in captured.err


def test_profile_checks_out_and_script_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('the script must not run')\n")
    outdir = tmp_path / "outdir"
    outdir.mkdir()
    assert cli.main(["profile", str(script), "--out", str(outdir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"autocomp-advisor: error: --out: {outdir} is a directory; give a file name"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outdir", "train.py"]  # no .tmp
    assert cli.main(["profile", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a directory" in err


def test_profile_measures_every_shape_a_shipped_preset_may_compress() -> None:
    # recommend --policy may name any preset: a layer it weighs needs a measured error, so the
    # capture keeps gradients down to the smallest preset floor (it was 16,384 while the
    # default preset's was 4,096, leaving such layers on the priors).
    floors = {name: load_policy(name).min_numel for name in available_policies()}
    assert "default" in floors and "federated" in floors
    default_floor = ProfileRunner.Config(script=Path("train.py")).min_numel
    assert default_floor == min(floors.values()) == smallest_preset_min_numel()
    assert default_floor <= floors["default"]
    assert eligible((10, 256), default_floor)  # the digits CNN's head, 2,560 elements


def test_recommend_names_the_chosen_model_of_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = make_profile()
    small = dataclasses.replace(
        base.models[0],
        index=1,
        module_class="Critic",
        layers=base.models[0].layers[2:],
        buckets=base.models[0].buckets[:1],
    )
    path = tmp_path / "two.json"
    dataclasses.replace(base, models=(base.models[0], small)).save(path)
    assert recommend(path) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "model 0 of 2 (Net, 1.06M params)" in out
    assert "others: 1 (Critic, 10.2k params); --model I to choose" in out
    assert recommend(path, "--model", "1") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "model 1 of 2 (Critic, 10.2k params), as asked" in out


# ---- tier 1: the capture's bookkeeping, driven by hand -------------------------------------


class FakeDDP(torch.nn.Module):
    """What ModelCapture reads of a DistributedDataParallel: ``module`` and forward hooks."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


class FakeBucket:
    """One bucket holding all of a model's parameters, as DDP hands it to a comm hook."""

    def __init__(self, params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
        self._params, self._flat = params, flat

    def parameters(self) -> list[torch.nn.Parameter]:
        return self._params

    def buffer(self) -> torch.Tensor:
        return self._flat

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True


def fake_capture(session: CaptureSession, module: torch.nn.Module) -> ModelCapture:
    capture = ModelCapture(FakeDDP(module), len(session.models), session)  # type: ignore[arg-type]
    capture.hook_installed = True  # no real process group to register a hook with
    session.models.append(capture)
    return capture


def run_backward(capture: ModelCapture, flat: torch.Tensor | None = None) -> None:
    """One backward through ``capture``'s timed hook (an all-reduce of one rank: identity)."""

    def identity(state: object, bucket: FakeBucket) -> torch.futures.Future[torch.Tensor]:
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    params = [p for _, p in capture.params]
    if flat is None:
        flat = torch.randn(sum(p.numel() for p in params))
    capture.observed(identity, reports_itself=False)(None, FakeBucket(params, flat))


def run_forward(capture: ModelCapture) -> None:
    capture._pre_forward(capture.ddp, ())
    capture._post_forward(capture.ddp, (), None)


class FakeClock:
    """``time.perf_counter`` for the profiler and the capture, set by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_compute_step_of_a_short_run_is_a_per_step_median(monkeypatch: pytest.MonkeyPatch) -> None:
    # s10_short: the script ends before --steps; its last step is followed by no other and
    # has a long exposed tail (waiting for a slower peer). Medians of step, E and hook taken
    # separately used to subtract to nothing (compute_step_s = 1e-9, efficiency 0%).
    clock = FakeClock()
    monkeypatch.setattr(timing_module, "now", clock)
    monkeypatch.setattr(capture_module, "now", clock)

    def run(steps: list[tuple[float, float]]) -> ModelCapture:
        """Steps (start, exposed): forward 1 ms, the bucket 2 ms later (the backward), the
        hook 0.1 ms, its collective done ``exposed`` after the hook returned."""
        session = CaptureSession(steps=6, rank=1, min_numel=16, progress=False)
        capture = fake_capture(session, torch.nn.Linear(4, 4))
        params = [p for _, p in capture.params]
        for start, exposed in steps:
            clock.t = start
            capture._pre_forward(capture.ddp, ())
            clock.t = start + 0.001
            capture._post_forward(capture.ddp, (), None)
            future: torch.futures.Future[torch.Tensor] = torch.futures.Future()

            def pending(state: object, bucket: FakeBucket) -> torch.futures.Future[torch.Tensor]:
                clock.t += 0.0001  # the hook's own work
                return future  # noqa: B023 (called at once, in this iteration)

            clock.t = start + 0.003
            flat = torch.randn(sum(p.numel() for p in params))
            capture.observed(pending, reports_itself=False)(None, FakeBucket(params, flat))
            clock.t += exposed
            future.set_result(flat)
        session.finish()  # the script ended
        return capture

    capture = run([(0.0, 0.001), (0.05, 0.0002), (0.06, 0.03)])
    model, notes = capture.profile()
    assert model is not None
    timing = model.timing
    assert timing.steps_used == 2
    assert timing.forward_s == pytest.approx(0.001)
    assert timing.backward_s == pytest.approx(0.002)
    assert timing.step_s == pytest.approx(0.010)  # first bucket to the next one
    assert timing.hook_s == pytest.approx(0.0001)
    assert timing.compute_step_s == pytest.approx(0.010 - 0.0002 - 0.0001)
    assert timing.exposed_comm_s == pytest.approx(0.0002)  # from the same step as step_s
    assert capture.local_step_seconds() == pytest.approx(0.010)
    assert any(n.startswith("model 0: UNRELIABLE step time") for n in notes), notes
    # A step whose exposed time swallows it is floored at forward + backward.
    capture = run([(0.0, 0.001), (0.05, 0.0095), (0.06, 0.0095), (0.07, 0.0095)])
    model, notes = capture.profile()
    assert model is not None
    assert model.timing.step_s == pytest.approx(0.010)
    assert model.timing.compute_step_s == pytest.approx(0.003)
    assert not any("UNRELIABLE" in n for n in notes)


def test_a_gan_is_counted_once_per_iteration_each_model_timed_on_its_own() -> None:
    # s5_gan: D syncs in lossD.backward() and again in lossG.backward(); G only in the
    # latter. Steps are iterations: the model with the fewest backwards (G).
    session = CaptureSession(steps=3, rank=1, min_numel=16, progress=False)
    g = fake_capture(session, torch.nn.Linear(8, 16))
    d = fake_capture(session, torch.nn.Linear(16, 1))
    iterations = 0
    with pytest.raises(_StopScript):
        while iterations < 10:
            run_forward(g)  # fake = G(z)
            run_forward(d)  # D(real) + D(fake.detach())
            run_forward(d)
            run_backward(d)  # lossD.backward()
            run_forward(d)  # D(fake)
            run_backward(d)  # lossG.backward(): D's buckets, then G's
            run_backward(g)
            iterations += 1
    assert iterations == 3 and session.steps_done == 3
    assert (g.backwards, d.backwards) == (3, 6)
    g_model, _ = g.profile()
    d_model, _ = d.profile()
    assert g_model is not None and d_model is not None
    assert (g_model.timing.steps_used, d_model.timing.steps_used) == (2, 5)


def test_gradients_of_a_parameter_unused_in_the_first_step_are_sampled_later() -> None:
    # s4_unused (find_unused_parameters=True): a branch unused in step 1 has a zero gradient
    # there; its norm and its compressor sample must come from the steps that used it.
    session = CaptureSession(steps=10, rank=0, min_numel=16, progress=False)
    capture = fake_capture(session, torch.nn.Sequential(torch.nn.Linear(8, 4, bias=False)))
    norms, l1s = [], []
    for step in range(3):
        grad = torch.zeros(32) if step == 0 else torch.randn(32)
        norms.append(float(grad.norm()))
        l1s.append(float(grad.abs().sum()))
        run_forward(capture)
        run_backward(capture, grad)
    sample = capture.samples[(4, 8)]
    assert float(sample.norm()) > 0
    expected = norms[1]  # the first step that used it
    assert capture.grad_norms["0.weight"] == pytest.approx(expected, rel=1e-6)
    model, _ = capture.profile()
    assert model is not None
    assert model.layer("0.weight").grad_norm == pytest.approx(expected, rel=1e-6)
    # Its L1 norm (what error_weight = "grad_l1" weighs) comes from that same step.
    assert model.layer("0.weight").grad_l1 == pytest.approx(l1s[1], rel=1e-6)


class _ComplexThenReal(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mix = torch.nn.Parameter(torch.zeros(4, 8, dtype=torch.complex64))
        self.weight = torch.nn.Parameter(torch.zeros(4, 8))


def test_a_complex_parameter_is_read_from_the_bucket_as_its_real_view() -> None:
    # DDP buckets a complex gradient as its real view (twice the elements). Sliced by the
    # complex element count, the parameter after it was read from the wrong offset.
    session = CaptureSession(steps=10, rank=0, min_numel=16, progress=False)
    capture = fake_capture(session, _ComplexThenReal())
    flat = torch.cat([torch.full((64,), 1.0), torch.full((32,), 3.0)])
    for _ in range(3):
        run_forward(capture)
        run_backward(capture, flat)
    assert capture.grad_norms["mix"] == pytest.approx(8.0)  # sqrt(64)
    assert capture.grad_norms["weight"] == pytest.approx(3.0 * 32**0.5)
    model, _ = capture.profile()
    assert model is not None
    assert model.layer("mix").shape == (4, 8, 2) and model.layer("mix").dtype == "float32"


def test_a_static_autocomp_hook_reports_to_the_capture_profiler_an_adaptive_one_is_timed() -> None:
    # One instrumentation stack: autocomp's own hook reports to the model's StepProfiler
    # (attached to its state); one whose state already has a profiler (adaptive mode) keeps
    # it, and its calls are timed from outside instead.
    session = CaptureSession(steps=3, rank=1, min_numel=16, progress=False)
    capture = fake_capture(session, torch.nn.Linear(4, 4))
    static = HookState(None, {}, {}, rank=0, world_size=1)
    hook = capture.adopt(static, autocomp_hook)
    assert static.profiler is capture.profiler and capture.hook_state is static
    assert static.step_listener is not None and hook.__annotations__ == {}
    static.step_listener(0)  # the hook's first bucket of a step
    assert len(capture.steps) == 1
    capture.release()
    assert static.profiler is None and static.step_listener is None

    other = fake_capture(session, torch.nn.Linear(4, 4))
    adaptive = HookState(None, {}, {}, rank=0, world_size=1)
    own = adaptive.profiler = profiler.StepProfiler()
    other.adopt(adaptive, autocomp_hook)
    assert adaptive.profiler is own and other.hook_state is None


# ---- tier 1: ``profile`` in process, scripts that never reach DDP ---------------------------


def profile_in_process(
    script: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """``profile`` as one launched rank (``RANK=0``), in this process: no spawn."""
    monkeypatch.setenv("RANK", "0")
    code = cli.main(["profile", str(script), "--out", str(script.with_suffix(".json"))])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("call", "lines"),
    [
        ("sys.exit(3)", ["the script exited with status 3 before it built a DDP model"]),
        (
            "sys.exit('error: dataset not found at /data; pass --data')",
            [
                "error: dataset not found at /data; pass --data",  # as Python prints it
                "the script exited with status 1 before it built a DDP model",
            ],
        ),
    ],
)
def test_profile_shows_why_the_script_exited(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    call: str,
    lines: list[str],
) -> None:
    script = tmp_path / "exits.py"
    script.write_text(f"import sys\n{call}\n")
    code, err = profile_in_process(script, monkeypatch, capsys)
    assert code == 1
    for line in lines:
        assert line in err, err
    assert "failed before" not in err


def test_profile_of_a_syntax_error_shows_no_runner_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "typo.py"
    script.write_text("import torch\ndef main(:\n    pass\n")
    code, err = profile_in_process(script, monkeypatch, capsys)
    assert code == 1
    assert f'File "{script}", line 2' in err and "SyntaxError: invalid syntax" in err
    assert "Traceback" not in err and "runpy" not in err
    assert not any(f"{name}.py" in err for name in ("runner", "session", "capture"))


# ---- tier 2: real scripts ------------------------------------------------------------------


def run_advisor(*args: str, cwd: Path = REPO, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autocomp.advisor", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_profile_missing_script_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["profile", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"autocomp-advisor: error: script not found: {tmp_path}/nope.py"]


@pytest.mark.multirank
def test_profile_and_recommend_the_digits_example_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autocomp_bench.workloads import DigitsCNN

    out = tmp_path / "profile.json"
    done = run_advisor(
        "profile",
        "examples/digits_cnn.py",
        "--steps",
        "5",
        "--out",
        str(out),
        "--compressor-budget",
        "3",
        "--link-budget",
        "2",
    )
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stderr
    profile = Profile.load(out)
    assert profile.complete and profile.world_size == 2
    assert profile.script.steps_captured == 5
    model = profile.model()
    expected = [(n, tuple(p.shape)) for n, p in DigitsCNN().named_parameters()]
    assert [(layer.name, layer.shape) for layer in model.layers] == expected
    assert all(layer.bucket is not None for layer in model.layers)
    assert sorted(n for b in model.buckets for n in b.params) == sorted(n for n, _ in expected)
    ready = [b.ready_s for b in model.buckets]
    assert ready == sorted(ready) and model.timing.backward_s == pytest.approx(ready[-1])
    assert 0 <= model.timing.hideable_s <= model.timing.backward_s
    assert 0 < model.timing.compute_step_s <= model.timing.step_s
    assert len(model.timing.rank_step_s) == 2
    assert profile.link is not None and profile.link.bandwidth_bytes_per_s > 0
    assert len(profile.link.samples) >= 10
    # The machine's costs beside the link, as the controller's opening takes them (loopback
    # and gloo on CPU: both half types timed; a cost under its noise floor reads 0).
    assert profile.link.contention_seconds_per_byte >= 0
    halves = dict(profile.link.half_sum_seconds_per_element)
    assert set(halves) == {"float16", "bfloat16"} and min(halves.values()) >= 0
    assert profile.measurement(build_compressor("powersgd:rank=4").spec, (256, 1024))

    page, advice = tmp_path / "advice.html", tmp_path / "advice.json"
    code = cli.main(
        [
            "recommend",
            str(out),
            "--bandwidth",
            "50Mbit",
            "--world-size",
            "64",
            "--json",
            str(advice),
            "--html",
            str(page),
            "--sweep-points",
            "5",
        ]
    )
    assert code == 0
    terminal = capsys.readouterr().out
    assert "DigitsCNN" in terminal and "What if: 50 Mbit/s" in terminal
    data = json.loads(advice.read_text())
    assert data["verdict"]["kind"] in {"compress", "in_between", "do_not_compress"}
    assert data["verdict"]["top_layers"][0]["name"] == "fc.weight"
    assert all(math.isfinite(o["step_s"]) and o["step_s"] > 0 for o in data["options"])
    assert "<svg" in page.read_text()


@pytest.mark.multirank
def test_profile_of_a_script_that_raises_shows_its_traceback(tmp_path: Path) -> None:
    script = tmp_path / "broken_train.py"
    script.write_text(
        "def load_data():\n    raise ValueError('no such dataset: imagenet')\n\nload_data()\n"
    )
    done = run_advisor("profile", str(script), "--nproc", "1", "--out", str(tmp_path / "p.json"))
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert 'broken_train.py", line 2, in load_data' in done.stderr
    assert "ValueError: no such dataset: imagenet" in done.stderr
    assert "runpy" not in done.stderr  # the runner's own frames are hidden
    assert not (tmp_path / "p.json").exists()


@pytest.mark.multirank
def test_profile_keeps_a_partial_profile_when_the_script_fails_late(tmp_path: Path) -> None:
    script = tmp_path / "diverges.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('gloo')\n"
        "model = DDP(torch.nn.Linear(64, 64))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(10):\n"
        "    model(torch.randn(4, 64)).square().mean().backward()\n"
        "    opt.step(); opt.zero_grad()\n"
        "    if step == 2:\n"
        "        raise FloatingPointError('loss is nan')\n"
    )
    out = tmp_path / "partial.json"
    done = run_advisor(
        "profile", str(script), "--nproc", "1", "--steps", "8", "--out", str(out),
        "--compressor-budget", "0",
    )  # fmt: skip
    assert done.returncode == 1
    assert "FloatingPointError: loss is nan" in done.stderr
    assert "kept the partial profile of the 3 step(s)" in done.stderr
    profile = Profile.load(out)
    assert not profile.complete and profile.script.steps_captured == 3
    assert "loss is nan" in profile.status


@pytest.mark.multirank
def test_profile_of_a_script_without_ddp_shows_how_to_wrap(tmp_path: Path) -> None:
    script = tmp_path / "single.py"
    script.write_text("import torch\nprint('loss', torch.nn.Linear(2, 1)(torch.ones(2)).item())\n")
    done = run_advisor("profile", str(script), "--nproc", "1", "--out", str(tmp_path / "p.json"))
    assert done.returncode == 1
    assert "loss" in done.stdout  # the script itself ran
    assert "built no torch.nn.parallel.DistributedDataParallel model" in done.stderr
    assert "model = torch.nn.parallel.DistributedDataParallel(model)" in done.stderr
    assert "dist.init_process_group" in done.stderr
    assert not (tmp_path / "p.json").exists()


TINY_DDP = (
    "import sys, torch, torch.distributed as dist\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "torch.set_num_threads(1)\n"
    "dist.init_process_group('gloo')\n"
    "model = DDP(torch.nn.Linear(32, 32))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
)


def profile_script(tmp_path: Path, body: str, *extra: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(TINY_DDP + body)
    return run_advisor(
        "profile", str(script), "--steps", "3", "--out", str(tmp_path / "p.json"),
        "--compressor-budget", "0", "--link-budget", "0.5", *extra,
    )  # fmt: skip


@pytest.mark.multirank
def test_profile_shows_the_failing_rank_as_the_likely_root_cause(tmp_path: Path) -> None:
    # b_rank1_fail: rank 0 only sees "Connection closed by peer"; the cause is on rank 1.
    done = profile_script(
        tmp_path,
        "for step in range(20):\n"
        "    if step == 1 and dist.get_rank() == 1:\n"
        "        raise ValueError('corrupt shard on rank 1')\n"
        "    model(torch.randn(4, 32)).square().mean().backward()\n"
        "    opt.step(); opt.zero_grad()\n",
        "--nproc",
        "2",
    )
    assert done.returncode == 1
    assert "--- rank 1 (likely root cause" in done.stderr, done.stderr
    assert done.stderr.count("ValueError: corrupt shard on rank 1") == 1
    assert 'train.py", line 9, in <module>' in done.stderr


@pytest.mark.multirank
def test_profile_of_a_late_sys_exit_says_why_and_keeps_the_partial_profile(
    tmp_path: Path,
) -> None:
    done = profile_script(
        tmp_path,
        "for step in range(20):\n"
        "    model(torch.randn(4, 32)).square().mean().backward()\n"
        "    opt.step(); opt.zero_grad()\n"
        "    if step == 1:\n"
        "        sys.exit('early stopping: validation loss diverged')\n",
        "--nproc",
        "1",
    )
    assert done.returncode == 1
    assert "early stopping: validation loss diverged\n" in done.stderr
    assert "the script exited with status 1; kept the partial profile of the 2 step(s)" in (
        done.stderr
    )
    profile = Profile.load(tmp_path / "p.json")
    assert not profile.complete and "early stopping" in profile.status


@pytest.mark.multirank
def test_profile_survives_a_bare_except_around_the_loop(tmp_path: Path) -> None:
    # b_bare_except: 'except:' catches the advisor's stop, then the script exits 1.
    done = profile_script(
        tmp_path,
        "try:\n"
        "    for step in range(50):\n"
        "        model(torch.randn(4, 32)).square().mean().backward()\n"
        "        opt.step(); opt.zero_grad()\n"
        "except:  # noqa: E722\n"
        "    sys.exit(1)\n",
        "--nproc",
        "1",
    )
    assert done.returncode == 0, done.stderr
    profile = Profile.load(tmp_path / "p.json")
    assert profile.complete and profile.script.steps_captured == 3
    assert any("caught the advisor's stop" in note for note in profile.notes)


@pytest.mark.multirank
def test_profile_reports_a_builtin_comm_hook_as_untimeable(tmp_path: Path) -> None:
    done = profile_script(
        tmp_path,
        "model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)\n"
        "for step in range(5):\n"
        "    model(torch.randn(4, 32)).square().mean().backward()\n"
        "    opt.step(); opt.zero_grad()\n",
        "--nproc",
        "1",
    )
    assert done.returncode == 1
    assert "comm hook cannot be timed" in done.stderr and "FP16_COMPRESS" in done.stderr
    assert "does it train" not in done.stderr
    assert "terminate called" not in done.stderr


@pytest.mark.multirank
def test_profile_of_a_script_wrapped_by_autocomp_measures_through_its_hook(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, torch.distributed as dist, autocomp\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "torch.set_num_threads(1)\n"
        "dist.init_process_group('gloo')\n"
        "model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8)))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "ctl = autocomp.wrap(model, plan={'*.bias': 'none', '*': 'powersgd:rank=2'})\n"
        "for step in range(20):\n"
        "    model(torch.randn(4, 256)).square().mean().backward()\n"
        "    opt.step(); opt.zero_grad()\n"
    )
    done = run_advisor(
        "profile", str(script), "--nproc", "1", "--steps", "5", "--out", str(tmp_path / "p.json"),
        "--compressor-budget", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    profile = Profile.load(tmp_path / "p.json")
    assert profile.complete and profile.script.steps_captured == 5
    assert "model 0: timed the script's own comm hook autocomp_hook" in profile.notes
    model = profile.model()
    assert model.timing.steps_used == 4 and model.timing.hook_s > 0
    assert 0 < model.timing.compute_step_s <= model.timing.step_s
    assert not any("UNRELIABLE" in note for note in profile.notes)


@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_profile_of_a_sparse_embedding_records_its_rows_not_its_table(tmp_path: Path) -> None:
    """An ``nn.EmbeddingBag(sparse=True)`` reaches the capture as a sparse tensor: the profile
    records the bytes of rows and indices one rank contributed per step (64 bags of 4 tokens:
    256 rows of 16 floats, 256 int64 indices), its norm, and no traceback; the what-if never
    compresses it. (Before, sampling it sliced a sparse tensor and logged a dispatcher dump.)"""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "torch.set_num_threads(1)\n"
        "dist.init_process_group('gloo')\n"
        "torch.manual_seed(0)\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = torch.nn.EmbeddingBag(5000, 16, sparse=True)\n"
        "        self.fc = torch.nn.Linear(16, 2)\n"
        "    def forward(self, x):\n"
        "        return self.fc(self.emb(x))\n"
        "model = DDP(Net())\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "g = torch.Generator().manual_seed(dist.get_rank())\n"
        "for step in range(20):\n"
        "    x = torch.randint(0, 5000, (64, 4), generator=g)\n"
        "    model(x).square().mean().backward()\n"
        "    opt.step(); opt.zero_grad()\n"
    )
    done = run_advisor(
        "profile", str(script), "--nproc", "2", "--steps", "5", "--out", str(tmp_path / "p.json"),
        "--compressor-budget", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "could not sample" not in done.stderr
    profile = Profile.load(tmp_path / "p.json")
    model = profile.model()
    emb = model.layer("emb.weight")
    assert emb.sparse_bytes == 256 * 16 * 4 + 256 * 8
    assert emb.grad_norm > 0 and model.layer("fc.weight").sparse_bytes is None
    whatif = WhatIfModel(profile)
    evaluation = whatif.evaluate(scenario(0.05, world=4))
    assert all(r.plan["emb.weight"] == "none" for r in evaluation.results)
