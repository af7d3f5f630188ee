"""Tier 1, then tier 2: the averaged update's error from the ranks' summed sketches.

Tier 1 (no processes): the sketch is linear and unbiased on structured tensors (low rank, a
heavy column, rows that repeat at a multiple of the bucket count); the bucket count avoids the
tensor's periods; summed sketches of two "ranks" estimate the error of their averaged update,
not a rank's own; the window vector carries the sketches to rank 0 and refuses an estimate
when a rank is missing or sketched other steps.

Tier 2 (2 gloo ranks, the real hook in adaptive mode with PowerSGD pinned): every window's
estimate against the exact averaged error of the same steps, computed from the very tensors
the hook sketched.
"""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from autocomp.error_sketch import (
    SKETCH_WIDTH,
    averaged_error,
    sign_sketch,
    sketch_buckets,
    sketch_seed,
)
from autocomp.profiler import LayerSample, StepTimes, WindowProfile
from autocomp.window import WindowMeasurement, WindowVector


def _ratio(vector: torch.Tensor, seed: int) -> float:
    sketch = sign_sketch((vector,), seed, sketch_buckets(vector.shape))[0]
    return float(sketch.double().pow(2).sum() / vector.double().pow(2).sum())


def _structured() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    low_rank = torch.randn(512, 1, generator=g) @ torch.randn(1, 256, generator=g)
    noisy = low_rank + 0.1 * torch.randn(512, 256, generator=g)
    heavy = noisy.clone()
    heavy[:, 5] *= 30.0
    repeated = torch.randn(1, 122, generator=g).repeat(300, 1)  # row = 2 x 61
    conv = torch.randn(64, 32, 3, 3, generator=g)
    short = torch.randn(10, generator=g)  # fewer elements than buckets: only the tail row
    return {
        "rank1+noise": noisy,
        "heavy column": heavy,
        "repeated rows": repeated,
        "conv": conv,
        "short": short,
    }


def test_the_sketch_is_linear() -> None:
    """Summing the ranks' sketches is sketching their sum (what the window's all-reduce
    relies on)."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(300, 70, generator=g), torch.randn(300, 70, generator=g)
    seed, buckets = sketch_seed(7, 3), sketch_buckets(a.shape)
    both = sign_sketch((a, b), seed, buckets)
    summed = sign_sketch((a + b,), seed, buckets)[0]
    torch.testing.assert_close(both[0] + both[1], summed, rtol=1e-5, atol=1e-4)
    assert both.shape == (2, SKETCH_WIDTH)
    assert float(both[:, buckets:].abs().sum()) == 0.0


@pytest.mark.parametrize("name", list(_structured()))
def test_the_sketch_is_unbiased_on_structured_tensors(name: str) -> None:
    """Over 400 seeds the mean of |S v|^2 / |v|^2 is 1 within four standard errors, and one
    sketch's spread is near sqrt(2 / b), the count sketch's (not worse than 2x: no structure
    of these tensors collapses the buckets). A tensor shorter than the buckets is exact."""
    vector = _structured()[name]
    ratios = [_ratio(vector, seed) for seed in range(400)]
    mean, spread = statistics.fmean(ratios), statistics.stdev(ratios)
    assert abs(mean - 1.0) <= 4 * spread / math.sqrt(len(ratios)) + 1e-6, (mean, spread)
    if vector.numel() <= SKETCH_WIDTH:  # one element a bucket: exact
        assert spread < 1e-6
    else:
        assert spread < 2 * math.sqrt(2 / sketch_buckets(vector.shape)), spread


def test_the_bucket_count_divides_none_of_the_periods() -> None:
    assert sketch_buckets((300, 122)) == 59  # 122 = 2 x 61
    assert sketch_buckets((61,)) == 61  # a vector has no rows
    assert sketch_buckets((59 * 61, 3)) == 61  # the rows are 3 long
    assert sketch_buckets((64, 61, 3)) == 59  # 61 x 3 is a row of the matrix view
    assert sketch_buckets((64, 32, 3, 3)) == 61
    for shape in ((300, 122), (59, 61, 53), (4096, 1024), (2, 61 * 59 * 53 * 47)):
        buckets = sketch_buckets(shape)
        periods = [math.prod(shape[i:]) for i in range(1, len(shape))]
        assert all(p % buckets for p in periods) or buckets == 61


def test_summed_sketches_estimate_the_averaged_updates_error() -> None:
    """Two ranks whose inputs share a low-rank mean and differ by their own noise, each
    compressed to the shared top-4 subspace of their sum (as PowerSGD's shared factors do).
    A rank's own reading counts its noise as error; the averaged update's error is much
    smaller. The ranks' sketches, summed and then squared step by step (as the window does),
    estimate it within 5% over 50 steps. Summed over the steps before squaring, they would not
    improve on one sketch's spread: the steps' cross terms do not average out."""
    g = torch.Generator().manual_seed(2)
    lost_squares = input_squares = exact_lost = exact_input = own = 0.0
    for step in range(50):
        mean = torch.randn(256, 4, generator=g) @ torch.randn(4, 128, generator=g)
        inputs = [mean + torch.randn(256, 128, generator=g) for _ in range(2)]
        u, _, _ = torch.linalg.svd(sum(inputs), full_matrices=False)
        basis = u[:, :4]
        losts = [x - basis @ (basis.T @ x) for x in inputs]
        seed, buckets = sketch_seed(11, step), sketch_buckets(mean.shape)
        pairs = zip(losts, inputs, strict=True)
        sketches = [sign_sketch((lost, x), seed, buckets) for lost, x in pairs]
        summed = (sketches[0] + sketches[1]).double()
        lost_squares += float(summed[0].pow(2).sum())
        input_squares += float(summed[1].pow(2).sum())
        exact_lost += float((losts[0] + losts[1]).double().pow(2).sum())
        exact_input += float((inputs[0] + inputs[1]).double().pow(2).sum())
        own += float(losts[0].norm() ** 2 / inputs[0].norm() ** 2) / 50
    exact = math.sqrt(exact_lost / exact_input)
    estimate = averaged_error(lost_squares, input_squares)
    assert estimate is not None
    assert estimate == pytest.approx(exact, rel=0.05)
    # Averaged over two ranks, the independent noise has half its power: the per-rank
    # reading overstates the error (here 0.44 against 0.32).
    assert math.sqrt(own) > 1.25 * exact
    assert averaged_error(1.0, 0.0) is None


def _times() -> StepTimes:
    return StepTimes(
        step_seconds=1.0,
        backward_seconds=0.5,
        hideable_seconds=0.2,
        comm_busy_seconds=0.3,
        compress_seconds=0.0,
        exposed_seconds=0.1,
    )


SKETCH_STEPS = 2


def _rank_vector(vector: WindowVector, sketches: list[tuple[int, list[float]]]) -> torch.Tensor:
    samples = {
        "w": LayerSample(
            grad_norm=2.0,
            residual_norm=1.0,
            rel_error=0.5,
            spec="powersgd:rank=4",
            sketches=sketches,
        ),
    }
    profile = WindowProfile(
        steps=4, times=_times(), collectives=[], layer_seconds={}, layer_samples=samples
    )
    return vector.pack(
        profile, 0.0, 0, set(), {"w": 0, "b": 0}, sketched=["w"], sketch_steps=SKETCH_STEPS
    )


def _sketch(lost: dict[int, float], given: dict[int, float]) -> list[float]:
    values = [0.0] * (2 * SKETCH_WIDTH)
    for i, v in lost.items():
        values[i] = v
    for i, v in given.items():
        values[SKETCH_WIDTH + i] = v
    return values


def test_the_window_vector_squares_each_steps_sum_and_refuses_a_partial_one() -> None:
    vector = WindowVector(["w", "b"])
    specs = {"w": "powersgd:rank=4", "b": "none"}

    def layers(combined: torch.Tensor) -> dict[str, Any]:
        return vector.layers(
            combined, specs, {"w": 0, "b": 0}, 2, sketched=["w"], sketch_steps=SKETCH_STEPS
        )

    # Step 8: lost (1, 2) and (-1, 1) sum to (0, 3); inputs 3 and 5 to 8. Step 9: lost 1 and 1
    # sum to 2, inputs 2 and 2 to 4. Squared per step: (9 + 4) / (64 + 16).
    a = [(8, _sketch({0: 1.0, 1: 2.0}, {0: 3.0})), (9, _sketch({2: 1.0}, {5: 2.0}))]
    b = [(8, _sketch({0: -1.0, 1: 1.0}, {0: 5.0})), (9, _sketch({2: 1.0}, {5: 2.0}))]
    window = layers(_rank_vector(vector, a) + _rank_vector(vector, b))
    assert window["w"].avg_error == pytest.approx(math.sqrt(13 / 80))
    assert window["w"].rel_error == pytest.approx(0.5)  # the per-rank reading, unchanged
    assert window["b"].avg_error is None

    # Only the last ``sketch_steps`` steps travel (both ranks alike).
    early = (7, _sketch({0: 100.0}, {0: 1.0}))
    window = layers(_rank_vector(vector, [early, *a]) + _rank_vector(vector, [early, *b]))
    assert window["w"].avg_error == pytest.approx(math.sqrt(13 / 80))

    missing = _rank_vector(vector, a) + _rank_vector(vector, [])
    assert layers(missing)["w"].avg_error is None  # one rank's residual absent

    shifted = _rank_vector(vector, a) + _rank_vector(vector, [(9, b[0][1]), (10, b[1][1])])
    assert layers(shifted)["w"].avg_error is None  # the ranks sketched different steps

    one_short = _rank_vector(vector, a) + _rank_vector(vector, b[1:])
    assert layers(one_short)["w"].avg_error is None

    # Without sketched layers the layout is the old one.
    plain = vector.pack(None, 0.0, 0, set(), {})
    assert plain.numel() == vector.HEADER + vector.PER_LAYER * 2


# ---- tier 2 -----------------------------------------------------------------------------------

STEPS = 41
WINDOW = 10


def _pinned_powersgd(rank: int, world_size: int, record: str) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import autocomp
    import autocomp.hook_layer as hook_layer
    from tests.models import MultiBucketNet, classification_batch

    os.environ["AUTOCOMP_RECORD_WINDOWS"] = record if rank == 0 else ""
    seeds: dict[int, tuple[int, int]] = {}
    sketched: list[tuple[int, torch.Tensor]] = []
    real_seed, real_sketch = hook_layer.sketch_seed, hook_layer.sign_sketch

    def seed_of(layer_seed: int, step: int) -> int:
        seed = real_seed(layer_seed, step)
        seeds[seed] = (layer_seed, step)
        return seed

    def sketch(vectors: Any, seed: int, buckets: int) -> torch.Tensor:
        sketched.append((seed, vectors[0].detach().double().reshape(-1).clone()))
        return real_sketch(vectors, seed, buckets)

    hook_layer.sketch_seed, hook_layer.sign_sketch = seed_of, sketch
    torch.manual_seed(0)
    model = MultiBucketNet()
    ddp = DDP(model, bucket_cap_mb=0.02)
    ctl = autocomp.wrap(
        ddp,
        target_overlap=0.9,
        plan=[("*.bias", "none"), ("norm.*", "none"), ("*", "powersgd:rank=2")],
        window=WINDOW,
        warmup_steps=2,
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = classification_batch(rank, step)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    names = {slot.seed: name for name, slot in ctl._state.slots.items()}
    ctl.close()
    dist.barrier()
    # The hook sketches the input first, then what was lost, under one seed.
    calls: dict[tuple[str, int], list[torch.Tensor]] = {}
    for seed, vector in sketched:
        layer_seed, step = seeds[seed]
        calls.setdefault((names[layer_seed], step), []).append(vector)
    return {key: (pair[0], pair[1]) for key, pair in calls.items()}


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_window_estimates_match_the_averaged_updates_exact_error(tmp_path: Path) -> None:
    from tests.multirank import run_ranks

    record = tmp_path / "windows.jsonl"
    ranks = run_ranks(_pinned_powersgd, 2, tmp_path / "ranks", str(record))
    import json

    lines = [json.loads(line) for line in record.read_text().splitlines()]
    windows = [WindowMeasurement.from_dict(r["measurement"]) for r in lines if "measurement" in r]
    pairs, own_over_average = [], []
    previous = 0
    for window in windows:
        for name, layer in window.layers.items():
            steps = [s for (n, s) in ranks[0] if n == name and previous <= s < window.step]
            if not steps or layer.spec == "none":
                continue
            assert layer.avg_error is not None, (window.step, name)
            lost = sum(float(sum(r[(name, s)][1] for r in ranks).pow(2).sum()) for s in steps)
            total = sum(float(sum(r[(name, s)][0] for r in ranks).pow(2).sum()) for s in steps)
            exact = math.sqrt(lost / total)
            pairs.append((layer.avg_error, exact))
            own_over_average.append(layer.rel_error / exact)
        previous = window.step
    assert len(pairs) >= 8
    # One window's estimate pools two steps: a spread of about 0.18 / sqrt(2) a sketch in e^2.
    squared = [(estimate / exact) ** 2 for estimate, exact in pairs]
    assert statistics.median(abs(r - 1) for r in squared) < 0.2, squared
    assert statistics.fmean(squared) == pytest.approx(1.0, abs=0.1), squared
    # Different data per rank: each rank's own reading is well above the average's error.
    assert statistics.median(own_over_average) > 1.1, own_over_average
