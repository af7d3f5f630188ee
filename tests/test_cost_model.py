"""Tier 1: pure unit, no processes.

:mod:`autocomp.cost_model` and :mod:`autocomp.cost_prior`: the analytic prior is sane (grows
with size, PowerSGD with rank, all-gather decoding with the world size; ``none`` is free); the
learned correction beats the
prior clearly on held-out shapes of a known synthetic cost function and stays bounded far
outside the training range; refits follow the configured cadence; save/load and state_dict
round trips reproduce predictions exactly; corrupt and other-version files raise ValueError
naming the file; prediction_error matches a hand computation; the calibration scales the
prior by size and by spec, and the opening's ``calibrate`` times the largest matrix within its
budget.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from autocomp.calibration import LARGE_CALIBRATION_MAX_NUMEL, calibrate, calibration_shape_for
from autocomp.compressors import Collective, available_compressors, build_compressor
from autocomp.cost_model import FORMAT_VERSION, MAX_CONTENTION_RATE, CostModel
from autocomp.cost_prior import PRIORS, CostSample, prior_seconds, samples_from_bench
from autocomp.link_model import LinkEstimate

SPECS = [
    "fp16",
    "int8",
    "qsgd:levels=4",
    "sign",
    "topk:ratio=0.01",
    "topk:ratio=0.001",
    "randomk:ratio=0.01",
    "powersgd:rank=1",
    "powersgd:rank=4",
    "powersgd:rank=16",
]
TRAIN_SHAPES = [torch.Size([2**i, 2**j]) for i in range(4, 13, 2) for j in range(4, 13, 2)]
HELD_OUT_SHAPES = [
    torch.Size([2**i + 3, 3 * 2**j]) for i in range(5, 12, 2) for j in range(5, 11, 2)
]


def compressed(spec: str, shapes: list[torch.Size]) -> list[torch.Size]:
    """The shapes ``spec`` compresses (PowerSGD sends a matrix no wider than its rank whole,
    as 'none': no work to learn)."""
    compressor = build_compressor(spec)
    return [shape for shape in shapes if not compressor.sends_as_is(shape)]


def truth(spec: str, shape: torch.Size) -> float:
    """A 'machine' that differs from the prior non-trivially: slower, superlinear, per type."""
    compressor = build_compressor(spec)
    factor = 1.8 * (shape.numel() / 65536) ** 0.15
    if compressor.name == "topk":
        factor *= 1.5
    return prior_seconds(compressor, shape, 2) * factor


def trained_model(config: CostModel.Config | None = None, repeats: int = 2) -> CostModel:
    rng = np.random.default_rng(0)
    model = CostModel(config or CostModel.Config(refit_every=64))
    for _ in range(repeats):
        for spec in SPECS:
            for shape in compressed(spec, TRAIN_SHAPES):
                model.add_sample(spec, shape, truth(spec, shape) * rng.lognormal(0.0, 0.05))
    model.fit()
    return model


@pytest.fixture(scope="module")
def model() -> CostModel:
    return trained_model()


def mape(predict, specs=SPECS, shapes=HELD_OUT_SHAPES) -> float:
    errors = [
        abs(predict(spec, shape) - truth(spec, shape)) / truth(spec, shape)
        for spec in specs
        for shape in shapes
    ]
    return 100.0 * float(np.mean(errors))


# ---- prior -------------------------------------------------------------------------------------


def test_every_builtin_compressor_has_a_prior() -> None:
    assert set(available_compressors()) - {"none"} <= set(PRIORS)


@pytest.mark.parametrize("spec", [*SPECS, "bf16", "qsgd", "randomk:unbiased=false"])
def test_prior_grows_with_size(spec: str) -> None:
    compressor = build_compressor(spec)
    sizes = compressed(spec, [torch.Size([2**i, 2**i]) for i in range(2, 13)])
    assert len(sizes) >= 8
    costs = [prior_seconds(compressor, s, 2) for s in sizes]
    assert all(c > 0 for c in costs)
    assert all(a < b for a, b in itertools.pairwise(costs))
    # sane magnitudes for a CPU: microseconds for tiny layers, under a second for 16M elements
    assert 1e-6 < costs[0] < 1e-3 and costs[-1] < 1.0


def test_prior_powersgd_grows_with_rank_and_gather_with_world() -> None:
    shape = torch.Size([1024, 1024])
    ranks = [prior_seconds(build_compressor(f"powersgd:rank={r}"), shape, 2) for r in (1, 4, 16)]
    assert ranks[0] < ranks[1] < ranks[2]
    topk = build_compressor("topk")
    assert prior_seconds(topk, shape, 2) < prior_seconds(topk, shape, 8)
    fp16 = build_compressor("fp16")  # all-reduce: one summed payload whatever the world size
    assert prior_seconds(fp16, shape, 2) == prior_seconds(fp16, shape, 8)
    assert prior_seconds(build_compressor("none"), shape, 2) == 0.0
    assert CostModel().compress_seconds(build_compressor("none"), shape) == 0.0


def test_a_tensor_powersgd_would_send_whole_is_priced_as_none() -> None:
    """1-D tensors and matrices too thin for the rank: the hook sends them as 'none' does
    (``effective_compressor``), so the prior charges no work, at any rank."""
    bias = torch.Size([128])
    for rank in (1, 4, 16):
        assert prior_seconds(build_compressor(f"powersgd:rank={rank}"), bias, 2) == 0.0
    thin = torch.Size([8, 4096])  # rank 16 >= 8 rows: sent whole
    assert prior_seconds(build_compressor("powersgd:rank=16"), thin, 2) == 0.0
    # The same matrix at a rank it does compress pays the family's work.
    assert prior_seconds(build_compressor("powersgd:rank=4"), thin, 2) > 0.0
    model = CostModel()
    assert model.compress_seconds("powersgd:rank=4", bias) == 0.0
    # A measurement of PowerSGD's own copy path (the compressor benchmark times it) is not a
    # sample: the hook never runs that path, and its prior of 0 has no correction to learn
    # (taken as one, the refit divided by it).
    fitting = CostModel(CostModel.Config(refit_every=1, min_fit_samples=2))
    fitting.add_sample("powersgd:rank=4", bias, 5e-5)
    assert fitting.samples == 0
    assert fitting.compress_seconds("powersgd:rank=4", bias) == 0.0
    bench = [
        {"spec": "powersgd:rank=4", "shape": [128], "seconds": 5e-5},
        {"spec": "fp16", "shape": [64, 64], "seconds": 1e-4},
        {"spec": "int8", "shape": [64, 64], "seconds": 2e-4},
    ]
    assert fitting.warm_start(bench) == 2 and fitting.fitted
    # A state saved before such timings were refused still loads, without them.
    state = fitting.state_dict()
    old_group = {"spec": "powersgd:rank=4,ef=true", "shape": [128], "world_size": 2}
    state["groups"].append({**old_group, "seconds": [5e-5]})
    state["fit_rows"].append({**old_group, "seconds": 5e-5, "weight": 1})
    clone = CostModel(fitting.config)
    clone.load_state_dict(state)
    assert clone.samples == fitting.samples and clone.fitted
    assert clone.compress_seconds("powersgd:rank=4", bias) == 0.0


TABLE = torch.Size([1 << 17, 64])
"""The n-gram task's hashed table: 8.4M elements, 0.5-0.6% of them nonzero in a gradient."""


def test_topk_prior_prices_the_selection_among_a_sparse_gradients_nonzeros() -> None:
    topk = build_compressor("topk:ratio=0.01")
    dense = prior_seconds(topk, TABLE, 2)
    sparse = prior_seconds(topk, TABLE, 2, nonzero_share=0.006)
    prior = PRIORS["topk"]
    # The selection over every element is replaced by a scan and a selection over 0.6%.
    saved = (prior.select_per_element_s * (1 - 0.006) - prior.scan_per_element_s) * TABLE.numel()
    assert sparse == pytest.approx(dense - 2.0 * saved)
    assert sparse < 0.5 * dense
    # Where largest_indices runs torch.topk over all elements, the price is the dense one:
    # on CUDA, on small tensors, and on gradients more than a quarter nonzero.
    assert prior_seconds(topk, TABLE, 2, 0.006, "cuda") == dense
    small = torch.Size([128, 256])
    assert prior_seconds(topk, small, 2, 0.006) == prior_seconds(topk, small, 2)
    assert prior_seconds(topk, TABLE, 2, 0.3) == dense
    assert prior_seconds(topk, TABLE, 2, 0.25) < dense
    # Dense compressors do not select: the share does not move their price.
    for spec in ("fp16", "powersgd:rank=4", "randomk:ratio=0.01", "int8"):
        compressor = build_compressor(spec)
        assert prior_seconds(compressor, TABLE, 2, 0.006) == prior_seconds(compressor, TABLE, 2)


def test_cost_model_reads_the_share_and_keeps_it_with_the_measurement() -> None:
    model = CostModel(CostModel.Config(min_fit_samples=2, refit_every=1))
    topk = build_compressor("topk:ratio=0.01")
    assert model.compress_seconds(topk, TABLE, 0.006) == prior_seconds(topk, TABLE, 2, 0.006)
    assert model.compress_seconds_many([(topk, TABLE), (topk, TABLE)], [1.0, 0.006]) == [
        model.compress_seconds(topk, TABLE),
        model.compress_seconds(topk, TABLE, 0.006),
    ]
    with pytest.raises(ValueError, match="nonzero shares for"):
        model.compress_seconds_many([(topk, TABLE)], [1.0, 0.5])
    # The share moves a price only on top-k's sparse path, and there to two digits (the
    # planner smooths it anew each window: no new cache entry for each value).
    assert model.compress_seconds("fp16", TABLE, 0.3) == model.compress_seconds("fp16", TABLE)
    assert model.compress_seconds(topk, TABLE, 0.00612) == model.compress_seconds(
        topk, TABLE, 0.0061
    )
    on_cuda = CostModel(CostModel.Config(device_type="cuda"))
    assert on_cuda.compress_seconds(topk, TABLE, 0.006) == prior_seconds(topk, TABLE, 2)
    # A top-k measured on the sparse table at its sparse price: the correction learned from
    # it is 1, so an unmeasured layer of the same kind keeps its own prior (no 4x "speed-up"
    # learned from comparing a sparse measurement with a dense prior).
    sparse_price = prior_seconds(topk, TABLE, 2, 0.006)
    model.add_sample(topk, TABLE, sparse_price, nonzero_share=0.006)
    other = torch.Size([1 << 16, 64])
    assert model.compress_seconds(topk, other) == pytest.approx(prior_seconds(topk, other, 2))
    fp16 = build_compressor("fp16")
    model.add_sample(fp16, other, prior_seconds(fp16, other, 2))
    assert model.fitted
    state = json.loads(json.dumps(model.state_dict()))
    assert [g["nonzero_share"] for g in state["groups"]] == [0.006, 1.0]
    clone = CostModel(model.config)
    clone.load_state_dict(state)
    for share in (1.0, 0.006, 0.1):
        assert clone.compress_seconds(topk, other, share) == model.compress_seconds(
            topk, other, share
        )
    state["groups"][0]["nonzero_share"] = 1.5
    with pytest.raises(ValueError, match="nonzero_share must be in"):
        clone.load_state_dict(state)
    with pytest.raises(ValueError, match="nonzero_share must be in"):
        model.add_sample(topk, TABLE, 0.1, nonzero_share=float("nan"))


# ---- learning ----------------------------------------------------------------------------------


def test_regressor_beats_prior_on_held_out_shapes(model: CostModel) -> None:
    prior_error = mape(lambda spec, shape: prior_seconds(build_compressor(spec), shape, 2))
    model_error = mape(model.compress_seconds)
    assert prior_error > 40.0  # the synthetic machine really differs from the prior
    assert model_error < 15.0
    assert model_error < prior_error / 3


def test_correction_bounded_outside_training_range(model: CostModel) -> None:
    huge = torch.Size([1 << 15, 1 << 14])  # 512M elements: far beyond the 16M trained on
    for spec in SPECS:
        ratio = model.compress_seconds(spec, huge) / prior_seconds(build_compressor(spec), huge, 2)
        largest_seen = max(
            truth(spec, s) / prior_seconds(build_compressor(spec), s, 2)
            for s in compressed(spec, TRAIN_SHAPES)
        )
        assert 1.0 < ratio < 1.2 * largest_seen


def test_batch_prediction_matches_single(model: CostModel) -> None:
    items = [(spec, shape) for spec in SPECS[:3] for shape in HELD_OUT_SHAPES[:4]]
    batch = model.compress_seconds_many(items)
    assert batch == [model.compress_seconds(c, s) for c, s in items]


def test_refit_cadence() -> None:
    model = CostModel(CostModel.Config(refit_every=10, min_fit_samples=10))
    shapes = [torch.Size([64 * (i + 1), 32]) for i in range(9)]
    for shape in shapes:
        model.add_sample("int8", shape, 1e-3)
    assert not model.fitted  # 9 samples: below both thresholds
    model.add_sample("int8", torch.Size([32, 32]), 1e-3)
    assert model.fitted
    # An unmeasured shape is predicted by the regressor, which only changes at a refit.
    unmeasured = torch.Size([110, 110])
    before = model.compress_seconds("int8", unmeasured)
    for _ in range(9):
        model.add_sample("int8", torch.Size([100, 100]), 1.0)  # wildly slower, but no refit yet
    assert model.compress_seconds("int8", unmeasured) == before
    model.add_sample("int8", torch.Size([100, 100]), 1.0)
    assert model.compress_seconds("int8", unmeasured) > 10 * before


def test_measured_layer_uses_its_own_measurements_at_once() -> None:
    model = CostModel()
    shape = torch.Size([300, 300])
    assert model.compress_seconds("topk", shape) == prior_seconds(
        build_compressor("topk"), shape, 2
    )
    model.add_sample("topk", shape, 0.5)
    model.add_sample("topk", shape, 0.7)
    model.add_sample("topk", shape, 0.6)
    assert model.compress_seconds("topk", shape) == pytest.approx(0.6)  # the median
    # Others, before any fit: their prior times measured/prior of what was measured.
    other = torch.Size([301, 300])
    scale = 0.6 / prior_seconds(build_compressor("topk"), shape, 2)
    expected = prior_seconds(build_compressor("topk"), other, 2) * scale
    assert model.compress_seconds("topk", other) == pytest.approx(expected)
    assert model.compress_seconds("fp16", other) == pytest.approx(
        prior_seconds(build_compressor("fp16"), other, 2) * scale
    )


def test_interim_scale_is_the_geometric_mean_over_measured_groups_weighted_by_prior() -> None:
    model = CostModel(CostModel.Config(min_fit_samples=100))
    a, b = torch.Size([200, 200]), torch.Size([400, 100])
    prior_a = prior_seconds(build_compressor("int8"), a, 2)
    prior_b = prior_seconds(build_compressor("fp16"), b, 2)
    model.add_sample("int8", a, 4 * prior_a)
    model.add_sample("fp16", b, 1 * prior_b)
    assert not model.fitted
    unmeasured = torch.Size([64, 64])
    scale = 4 ** (prior_a / (prior_a + prior_b))  # the larger prior weighs more
    assert model.compress_seconds("topk", unmeasured) == pytest.approx(
        scale * prior_seconds(build_compressor("topk"), unmeasured, 2)
    )


def test_a_small_tensors_per_call_overhead_barely_moves_the_interim_scale() -> None:
    """fp16 on the MLP LM at 1 Gbit/s: 66x its prior on a 16K-element tensor (the hook's
    per-call overhead), 4.5x on a 2M-element matrix. The scale carried to PowerSGD stays
    near the large matrix's ratio, where the unweighted mean was 17x."""
    model = CostModel(CostModel.Config(min_fit_samples=100))
    small, large = torch.Size([256, 64]), torch.Size([1024, 2048])
    model.add_sample("fp16", small, 66 * prior_seconds(build_compressor("fp16"), small, 2))
    model.add_sample("fp16", large, 4.5 * prior_seconds(build_compressor("fp16"), large, 2))
    psgd = build_compressor("powersgd:rank=4")
    ratio = model.compress_seconds(psgd, large) / prior_seconds(psgd, large, 2)
    assert 4.5 < ratio < 5.5  # the unweighted mean: sqrt(66 x 4.5) = 17.2


def test_manual_refit_only() -> None:
    model = CostModel(CostModel.Config(refit_every=4, min_fit_samples=4, auto_refit=False))
    for i in range(20):
        model.add_sample("sign", torch.Size([32 * (i + 1), 16]), 1e-3)
    assert not model.fitted
    model.fit()
    assert model.fitted


def test_a_batch_of_samples_refits_once_when_due() -> None:
    """``refit_if_due`` (what the planner calls after a window's samples, with
    ``auto_refit=False``): one refit for a batch past ``refit_every``, none before it, and
    none again until as many new samples have come."""
    model = CostModel(CostModel.Config(refit_every=8, min_fit_samples=4, auto_refit=False))
    fits = []
    fit = model.fit
    model.fit = lambda: (fits.append(model.samples), fit())[1]  # type: ignore[method-assign]
    for i in range(7):
        model.add_sample("sign", torch.Size([32 * (i + 1), 16]), 1e-3)
    assert not model.refit_if_due() and not model.fitted
    for i in range(7, 20):  # a window of 13 samples: past the cadence once, in one batch
        model.add_sample("sign", torch.Size([32 * (i + 1), 16]), 1e-3)
    assert model.refit_if_due() and model.fitted
    assert fits == [20]  # on every sample of the batch
    assert not model.refit_if_due()
    for i in range(20, 27):
        model.add_sample("sign", torch.Size([32 * (i + 1), 16]), 1e-3)
    assert not model.refit_if_due()
    model.add_sample("sign", torch.Size([32 * 28, 16]), 1e-3)
    assert model.refit_if_due() and fits == [20, 28]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_estimators", 0),
        ("n_estimators", 2.5),
        ("max_depth", True),
        ("max_depth", 0),
        ("learning_rate", 0.0),
        ("learning_rate", float("nan")),
    ],
)
def test_the_regressor_settings_are_checked_by_the_config(field: str, value: object) -> None:
    """The fit skips scikit-learn's own parameter validation, so the config checks them."""
    with pytest.raises(ValueError, match=field):
        CostModel.Config(**{field: value})  # type: ignore[arg-type]


def test_the_planner_refits_its_cost_model_once_per_window() -> None:
    """The planner's cost model refits after a window's samples, not inside them: a window
    with more compressed layers than ``refit_every`` refit once or twice mid-window before
    (21 fits in 13 decisions on a 196-tensor ViT)."""
    from autocomp.planner import WindowPlanner
    from autocomp.policy import load_policy
    from autocomp.window import LayerWindow, WindowMeasurement

    names = [f"b{i}.weight" for i in range(150)]
    shapes = {n: torch.Size([64 + i, 64]) for i, n in enumerate(names)}
    planner = WindowPlanner(
        load_policy("default"),
        names,
        shapes,
        dict.fromkeys(names, torch.float32),
        [],
        WindowPlanner.Config(window=10, warmup_steps=0),
        world_size=2,
    )
    assert not planner.cost_model.config.auto_refit
    fits = []
    fit = planner.cost_model.fit
    planner.cost_model.fit = lambda: (fits.append(planner.cost_model.samples), fit())[1]  # type: ignore[method-assign]
    layers = {
        n: LayerWindow(
            spec="int8",
            grad_norm=1.0,
            residual_norm=0.0,
            rel_error=None,
            hook_seconds=1e-3,
            bucket=0,
            bucket_hideable_seconds=0.0,
        )
        for n in names
    }
    measurement = WindowMeasurement(
        step=100,
        world_size=2,
        window_steps=10,
        profiled_ranks=2,
        timings={"step_seconds": 0.1},
        loss=None,
        layers=layers,
        busy_min=[],
        collectives=[],
    )
    planner._update_layers(measurement)
    assert fits == [150]


def test_warm_start_from_bench_document() -> None:
    document = {
        "benchmark": "autocomp_bench.compressors",
        "results": [
            {"spec": "none", "shape": [1024, 1024], "hook_ms": 0.0},
            *[
                {"spec": spec, "shape": list(shape), "hook_ms": truth(spec, shape) * 1e3}
                for spec in SPECS
                for shape in TRAIN_SHAPES
            ],
        ],
    }
    samples = samples_from_bench(document)
    # Sent whole (PowerSGD rank 16 on 16-row matrices): no hook time, skipped like 'none'.
    assert len(samples) == sum(len(compressed(spec, TRAIN_SHAPES)) for spec in SPECS) == 241
    model = CostModel()
    assert model.warm_start(samples) == len(samples)
    assert model.fitted
    assert mape(model.compress_seconds) < 15.0
    assert model.prediction_error()["compress"]["samples"] == 0  # offline data is not a test
    # plain dicts work too
    assert CostModel().warm_start([s.to_dict() for s in samples[:5]]) == 5


# ---- persistence -------------------------------------------------------------------------------


def test_save_load_round_trip_identical(model: CostModel, tmp_path: Path) -> None:
    trained = model
    model = CostModel(trained.config)  # a copy: the fixture is shared
    model.load_state_dict(trained.state_dict())
    model.update_link(LinkEstimate(60e-6, 50e6, 100, 0.05))
    model.add_sample("int8", torch.Size([300, 300]), 5e-3)  # pending: not in the current fit
    path = tmp_path / "cost.json"
    model.save(path)
    loaded = CostModel.load(path)
    shapes = [*HELD_OUT_SHAPES, torch.Size([7]), torch.Size([64, 3, 3, 3])]
    for spec in [*SPECS, "bf16", "qsgd"]:
        for shape in shapes:
            assert loaded.compress_seconds(spec, shape) == model.compress_seconds(spec, shape)
    assert loaded.comm_seconds(Collective.ALL_GATHER, 12345, 4) == model.comm_seconds(
        Collective.ALL_GATHER, 12345, 4
    )
    assert loaded.prediction_error() == model.prediction_error()
    assert loaded.samples == model.samples
    assert json.loads(path.read_text()) == json.loads(json.dumps(loaded.state_dict()))


def test_state_dict_round_trip_for_checkpoints(model: CostModel) -> None:
    state = json.loads(json.dumps(model.state_dict()))
    clone = CostModel(model.config)
    clone.load_state_dict(state)
    for spec in SPECS:
        shape = HELD_OUT_SHAPES[3]
        assert clone.compress_seconds(spec, shape) == model.compress_seconds(spec, shape)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "",
        json.dumps([1, 2, 3]),
        json.dumps({"format": "something else", "version": FORMAT_VERSION}),
    ],
    ids=["truncated", "empty", "list", "foreign"],
)
def test_corrupt_file_raises_naming_it(tmp_path: Path, content: str) -> None:
    path = tmp_path / "corrupt-cost.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape("corrupt-cost.json")):
        CostModel.load(path)


def test_damaged_content_raises_naming_file(model: CostModel, tmp_path: Path) -> None:
    state = model.state_dict()
    state["groups"][0]["spec"] = "nosuchcompressor"
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(state))
    with pytest.raises(ValueError, match=re.escape("damaged.json")):
        CostModel.load(path)


def test_wrong_version_raises_naming_file(tmp_path: Path) -> None:
    state = CostModel().state_dict()
    state["version"] = FORMAT_VERSION + 1
    path = tmp_path / "future-cost.json"
    path.write_text(json.dumps(state))
    with pytest.raises(ValueError, match=r"future-cost\.json.*version"):
        CostModel.load(path)
    with pytest.raises(ValueError, match=re.escape("missing.json")):
        CostModel.load(tmp_path / "missing.json")


# ---- communication and accuracy ----------------------------------------------------------------


def test_comm_prior_then_estimate() -> None:
    model = CostModel()
    # Before any estimate: 1 Gbit/s and 50 us per hop. N=2 all-reduce: 2 hops, 1 payload.
    assert model.comm_seconds(Collective.ALL_REDUCE, 1_250_000, 2) == pytest.approx(
        2 * 50e-6 + 1_250_000 / 125e6
    )
    model.update_link(LinkEstimate(0.0, 6.25e6, 64, 0.02))
    assert model.comm_seconds(Collective.ALL_GATHER, 625_000, 3) == pytest.approx(0.2)
    model.update_link(None)
    assert model.link.samples == 0


def test_contention_rate_is_the_measured_cost_per_byte_times_the_link() -> None:
    """The opening measures compute seconds lost per byte sent; the exposure model wants the
    share of the backward lost while the link is busy: per byte x bytes per second, capped
    below 1, 0 while the link or the contention is unknown. It survives a checkpoint."""
    model = CostModel()
    assert model.contention_seconds_per_byte == 0.0 and model.contention_rate() == 0.0
    model.update_contention(40e-9)  # 2 CPU cores, 50 Mbit/s veth (the opening's probe)
    assert model.contention_rate() == 0.0  # no link estimate yet
    model.update_link(LinkEstimate(0.0, 6.25e6, 64, 0.02))
    assert model.contention_rate() == pytest.approx(0.25)
    model.update_link(LinkEstimate(0.0, 1e9, 64, 0.02))
    assert model.contention_rate() == MAX_CONTENTION_RATE
    restored = CostModel()
    restored.load_state_dict(json.loads(json.dumps(model.state_dict())))
    assert restored.contention_seconds_per_byte == pytest.approx(40e-9)
    for bad in (-1e-9, math.inf, math.nan):
        with pytest.raises(ValueError, match="contention"):
            model.update_contention(bad)


def test_half_precision_sums_are_priced_per_element_and_checkpointed() -> None:
    """On CPU gloo sums halves slowly; the opening measures what that costs per element
    beyond the bytes, for float16 and bfloat16 only, and it survives a checkpoint."""
    model = CostModel()
    assert model.half_sum_seconds_per_element(torch.float16) == 0.0
    model.update_half_sum(torch.float16, 1.13e-9)
    model.update_half_sum(torch.bfloat16, 0.94e-9)
    assert model.half_sum_seconds_per_element(torch.float32) == 0.0
    restored = CostModel()
    restored.load_state_dict(json.loads(json.dumps(model.state_dict())))
    assert restored.half_sum_seconds_per_element(torch.float16) == pytest.approx(1.13e-9)
    assert restored.half_sum_seconds_per_element(torch.bfloat16) == pytest.approx(0.94e-9)
    with pytest.raises(ValueError, match="half"):
        model.update_half_sum(torch.float32, 1e-9)
    with pytest.raises(ValueError, match="half"):
        model.update_half_sum(torch.float16, -1.0)
    broken = model.state_dict()
    broken["half_sum_seconds_per_element"] = {"float32": 1e-9}
    with pytest.raises(ValueError, match="half sum"):
        CostModel().load_state_dict(broken)


def test_prediction_error_matches_hand_computation() -> None:
    model = CostModel()
    assert model.prediction_error()["comm"] == {
        "samples": 0,
        "median_ape_pct": None,
        "mean_ape_pct": None,
    }
    model.update_link(
        LinkEstimate(latency_s=0.0, bandwidth_bytes_per_s=1e6, samples=1, rel_residual=0)
    )
    # N=2 all-reduce puts exactly the payload on the link: predicted = bytes / 1e6 s
    model.add_comm_sample(Collective.ALL_REDUCE, 1_000_000, 2, 1.25)  # |1 - 1.25| / 1.25 = 20%
    model.add_comm_sample(Collective.ALL_REDUCE, 2_000_000, 2, 1.6)  # 0.4 / 1.6 = 25%
    model.add_comm_sample(Collective.ALL_REDUCE, 1_000_000, 2, 0.5)  # 0.5 / 0.5 = 100%
    model.add_comm_sample(Collective.ALL_REDUCE, 1_000_000, 1, 0.5)  # one rank: ignored
    comm = model.prediction_error()["comm"]
    assert comm["samples"] == 3
    assert comm["median_ape_pct"] == pytest.approx(25.0)
    assert comm["mean_ape_pct"] == pytest.approx((20 + 25 + 100) / 3)

    shape = torch.Size([256, 256])
    prior = prior_seconds(build_compressor("sign"), shape, 2)
    model.add_sample("sign", shape, 2 * prior)  # predicted = prior (nothing measured): 50%
    model.add_sample("sign", shape, prior / 2)  # predicted = the 2*prior measured: 300%
    model.add_sample("none", shape, 1.0)  # free by definition: ignored
    compress = model.prediction_error()["compress"]
    assert compress["samples"] == 2
    assert compress["median_ape_pct"] == pytest.approx(175.0)
    assert compress["mean_ape_pct"] == pytest.approx(175.0)


def test_cost_sample_dict_round_trip() -> None:
    sample = CostSample("topk:ratio=0.01,ef=true", (3, 4), 1.5e-3, world_size=4)
    assert CostSample.from_dict(json.loads(json.dumps(sample.to_dict()))) == sample
    with pytest.raises(ValueError):
        CostSample.from_dict({"spec": "int8"})
    assert math.isfinite(CostModel().compress_seconds(sample.spec, torch.Size(sample.shape)))


# ---- calibration by size ------------------------------------------------------------------------

MILLION = torch.Size([1024, 1024])
EIGHT_MILLION = torch.Size([8192, 1024])


def _calibrated(model: CostModel, spec: str, shape: torch.Size, factor: float) -> None:
    model.calibrate(spec, shape, factor * prior_seconds(build_compressor(spec), shape, 2))


def test_calibration_at_two_sizes_is_interpolated_in_log_size_and_flat_outside() -> None:
    """A price per element from 1M elements runs low on a table of 8M (fp16 cost 2x per
    element there): the factor follows the calibrated sizes, not the first one alone."""
    model = CostModel()
    _calibrated(model, "fp16", MILLION, 0.5)
    assert model.prior_scale("fp16", 2**23) == pytest.approx(0.5)  # one size: every size
    _calibrated(model, "fp16", EIGHT_MILLION, 2.0)
    assert model.prior_scale("fp16", 1000) == pytest.approx(0.5)
    assert model.prior_scale("fp16", 2**20) == pytest.approx(0.5)
    # 2M is a third of the way from 1M to 8M in log size: 0.5 x 4^(1/3).
    assert model.prior_scale("fp16", 2**21) == pytest.approx(0.5 * 4 ** (1 / 3))
    assert model.prior_scale("fp16", 2**23) == pytest.approx(2.0)
    assert model.prior_scale("fp16", 2**26) == pytest.approx(2.0)
    for shape, factor in [(MILLION, 0.5), (EIGHT_MILLION, 2.0), (torch.Size([2048, 1024]), 0.794)]:
        expected = factor * prior_seconds(build_compressor("fp16"), shape, 2)
        assert model.compress_seconds("fp16", shape) == pytest.approx(expected, rel=1e-3)
    # Timed again at a size already calibrated: the new reading replaces the old one.
    _calibrated(model, "fp16", EIGHT_MILLION, 1.0)
    assert model.prior_scale("fp16", 2**23) == pytest.approx(1.0)
    assert model.prior_scale("fp16", 2**20) == pytest.approx(0.5)


def test_each_spec_keeps_its_own_calibration_and_others_take_the_familys_latest() -> None:
    """Rank 4 and rank 16 are timed apart; keyed by family, the last one timed priced both
    (rank 16's growth with size is 1.75x per element on the n-gram table, rank 4's 1.16x)."""
    model = CostModel()
    _calibrated(model, "powersgd:rank=16", MILLION, 0.4)
    _calibrated(model, "powersgd:rank=4", MILLION, 0.6)
    _calibrated(model, "powersgd:rank=16", EIGHT_MILLION, 0.7)
    assert model.prior_scale("powersgd:rank=4", 2**23) == pytest.approx(0.6)
    assert model.prior_scale("powersgd:rank=16", 2**20) == pytest.approx(0.4)
    assert model.prior_scale("powersgd:rank=16", 2**23) == pytest.approx(0.7)
    # Not timed: the family's latest calibrations (rank 4's at 1M, rank 16's at 8M).
    assert model.prior_scale("powersgd:rank=2", 2**20) == pytest.approx(0.6)
    assert model.prior_scale("powersgd:rank=2", 2**23) == pytest.approx(0.7)
    assert model.prior_scale("int8", 2**20) == 1.0


def test_calibration_points_survive_a_round_trip_and_old_single_factors_load() -> None:
    model = CostModel()
    _calibrated(model, "fp16", MILLION, 0.5)
    _calibrated(model, "fp16", EIGHT_MILLION, 2.0)
    clone = CostModel()
    clone.load_state_dict(json.loads(json.dumps(model.state_dict())))
    for numel in (2**19, 2**21, 2**23):
        assert clone.prior_scale("fp16", numel) == model.prior_scale("fp16", numel)
    old = model.state_dict()
    old["prior_scale"] = {"fp16": 0.25}  # a file from before calibrations by size
    clone.load_state_dict(old)
    assert clone.prior_scale("fp16", 2**23) == 0.25
    assert clone.prior_scale("fp16:ef=false", 2**20) == 0.25
    for bad in ({"fp16": [[1024, -1.0]]}, {"fp16": []}, {"fp16": [[8, 1.0], [8, 2.0]]}):
        with pytest.raises(ValueError, match="malformed cost model state"):
            clone.load_state_dict({**old, "prior_scale": bad})


def test_the_calibration_shape_is_the_largest_matrix_cut_to_the_cap() -> None:
    assert calibration_shape_for([torch.Size([1024, 1024]), torch.Size([2**22])]) is None
    assert calibration_shape_for([]) is None
    shapes = [torch.Size([10]), torch.Size([2048, 1024]), torch.Size([64, 3, 3, 3])]
    assert calibration_shape_for(shapes) == torch.Size([2048, 1024])
    huge = torch.Size([2**20, 64])  # 64M elements: the rows are cut to 16M elements
    assert calibration_shape_for([huge]) == torch.Size([LARGE_CALIBRATION_MAX_NUMEL // 64, 64])


def test_calibrate_times_the_large_shape_cheapest_first_within_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scripted replays: each candidate's seconds on 1M elements and on the large shape (2M).
    The large calibration runs cheapest first while its estimate (2 calls x the 1M time x the
    elements x the largest growth seen) fits the budget; a candidate left out is priced at the
    median growth measured."""
    import autocomp.calibration as calibration

    on_1m = {"fp16": 1e-3, "powersgd": 3e-3, "int8": 10e-3}
    growth = {"fp16": 2.0, "powersgd": 1.2, "int8": 5.0}
    timed: list[tuple[str, tuple[int, ...], int]] = []

    def scripted(compressor, grad, world_size, calls):  # type: ignore[no-untyped-def]
        timed.append((compressor.name, tuple(grad.shape), calls))
        elements = grad.numel() / MILLION.numel()
        scale = 1.0 if grad.numel() == MILLION.numel() else growth[compressor.name]
        return on_1m[compressor.name] * elements * scale

    monkeypatch.setattr(calibration, "_replay_seconds", scripted)
    model = CostModel()
    large = torch.Size([2048, 1024])
    specs = ["none", "int8", "powersgd:rank=4", "fp16"]
    done = calibrate(model, specs, 2, torch.device("cpu"), large_shape=large, budget_seconds=0.05)
    # fp16: 2 x 1 ms x 2 = 4 ms, then growth 2; PowerSGD: 2 x 3 x 2 x 2 = 24 ms; int8:
    # 2 x 10 x 2 x 2 = 80 ms, over the 50 ms budget.
    assert done == [build_compressor("fp16").spec, build_compressor("powersgd:rank=4").spec]
    on_large = [t for t in timed if t[1] == tuple(large)]
    assert on_large == [("fp16", (2048, 1024), 2), ("powersgd", (2048, 1024), 2)]
    # Timed on the large shape: priced there as measured. int8, left out, at the median
    # growth per element measured there (of fp16's 2x and PowerSGD's 1.2x): 10 ms x 2 x 1.6.
    assert model.compress_seconds("fp16", large) == pytest.approx(4e-3)
    assert model.compress_seconds("powersgd:rank=4", large) == pytest.approx(7.2e-3)
    assert model.compress_seconds("int8", large) == pytest.approx(32e-3)
    assert model.compress_seconds("int8", MILLION) == pytest.approx(10e-3)
    # No large shape, or a budget of nothing: the 1M calibration alone.
    assert calibrate(CostModel(), specs, 2, torch.device("cpu")) == []
    assert calibrate(CostModel(), specs, 2, torch.device("cpu"), large, budget_seconds=0.0) == []
