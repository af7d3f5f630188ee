"""Tier 1: the step profiler's timeline arithmetic on a scripted clock (no processes).

One step is played with known timestamps: forward, three buckets handed to the hook (with
hook work between them), collectives that queue behind each other, a decode callback. The
window summary must give the quantities docs/policy.md defines: backward and hideable time
without the hook's own work, service times that do not charge queueing, exposed time after
the last hook call, and per bucket the backward left once it was ready. A layer's cost is
its hook work and its decode, per step the window closed. A gradient's sampled nonzero
share (what top-k's prior reads) is estimated well on an embedding table's sparse rows; its
L1 norm (what ``error_weight = "grad_l1"`` weighs) is exact in float32 and reaches the
window vector as a mean over ranks.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch

from autocomp.compressors import Collective
from autocomp.hook_layer import float32_norm, nonzero_share
from autocomp.profiler import LayerSample, StepProfiler, StepTimes, WindowProfile
from autocomp.timing import HostClock
from autocomp.window import WindowVector


class Clock(HostClock):
    """A host clock that reads a scripted time."""

    def __init__(self) -> None:
        self.t = 0.0

    def stamp(self) -> float:
        return self.t


def _done(clock: Clock, future: torch.futures.Future, at: float) -> None:
    clock.t = at
    future.set_result(None)


def _hook_call(
    prof: StepProfiler,
    clock: Clock,
    bucket: int,
    entered_at: float,
    exited_at: float,
    collective: Collective,
    payload_bytes: int,
) -> torch.futures.Future:
    """One hook call: bucket ready at ``entered_at``, one collective launched, back at
    ``exited_at``; returns the collective's future, completed later by :func:`_done`."""
    clock.t = entered_at
    entered = prof.hook_entered(bucket)
    future: torch.futures.Future = torch.futures.Future()
    prof.collective(collective, payload_bytes, future)
    clock.t = exited_at
    prof.hook_exited(entered)
    return future


def test_one_step_timeline() -> None:
    clock = Clock()
    prof = StepProfiler(clock)
    clock.t = 0.10
    prof.forward_done()  # the training forward ends; the backward that follows is this step's
    clock.t = 0.15
    prof.begin_step()  # the first bucket reaches the hook: the step begins
    # Bucket 0 ready at 0.15; the hook works 0.01 s and launches a 20 ms collective.
    f0 = _hook_call(prof, clock, 0, 0.15, 0.16, Collective.ALL_REDUCE, 1000)
    # Bucket 2 ready at 0.20 (0.19 of compute after the forward's end + 0.01 of hook work).
    f2 = _hook_call(prof, clock, 2, 0.20, 0.22, Collective.ALL_REDUCE, 2000)
    # Bucket 1, the last, ready at 0.30; its collective queues behind bucket 2's.
    f1 = _hook_call(prof, clock, 1, 0.30, 0.31, Collective.ALL_GATHER, 500)
    _done(clock, f0, 0.17)
    _done(clock, f2, 0.33)
    _done(clock, f1, 0.36)
    clock.t = 0.366
    decode_started = prof.stamp()
    clock.t = 0.37
    prof.bucket_finished(decode_started)
    clock.t = 0.55
    prof.begin_step()  # the next step's first bucket closes this one
    window = prof.end_window()
    assert window is not None and window.steps == 1
    times = window.times
    hook_before_last = 0.01 + 0.02  # buckets 0 and 2
    assert times.step_seconds == pytest.approx(0.40)
    assert times.backward_seconds == pytest.approx(0.30 - 0.10 - hook_before_last)
    assert times.hideable_seconds == pytest.approx(0.30 - 0.15 - hook_before_last)
    # Service: 0.15-0.17, 0.20-0.33, then 0.33-0.36 (queued behind, not charged the wait).
    assert times.comm_busy_seconds == pytest.approx(0.02 + 0.13 + 0.03)
    assert [s for _, _, s in window.collectives[0]] == pytest.approx([0.02, 0.13, 0.03])
    assert times.exposed_seconds == pytest.approx(0.37 - 0.31)
    assert times.compress_seconds == pytest.approx(0.01 + 0.02 + 0.01 + 0.004)
    # Per bucket, compute left after it was ready (hook work taken out): the last one has 0.
    last = 0.30 - hook_before_last
    assert times.bucket_hideable_seconds == pytest.approx(
        {0: last - 0.15, 2: last - (0.20 - 0.01), 1: 0.0}
    )
    assert times.bucket_hideable_seconds[0] == pytest.approx(times.hideable_seconds)
    # The compute-only step: the step without exposed time and compression work.
    assert times.compute_seconds == pytest.approx(0.40 - (0.37 - 0.31) - times.compress_seconds)


def test_controller_work_is_not_compute() -> None:
    """The opening (or a boundary) runs between a step's start and its first hook call: the
    step keeps its length, the backward and the compute-only reading leave it out."""
    clock = Clock()
    prof = StepProfiler(clock)
    clock.t = 0.10
    prof.forward_done()
    clock.t = 0.15
    prof.begin_step()
    started = prof.stamp()
    clock.t = 0.55  # 0.4 s of link probes and a decision
    prof.controller_work(started)
    f0 = _hook_call(prof, clock, 0, 0.55, 0.56, Collective.ALL_REDUCE, 1000)
    f1 = _hook_call(prof, clock, 1, 0.60, 0.61, Collective.ALL_REDUCE, 1000)
    _done(clock, f0, 0.58)
    _done(clock, f1, 1.61)  # a slow link: one second exposed
    clock.t = 1.70
    prof.begin_step()
    times = prof.end_window()
    assert times is not None
    t = times.times
    assert t.step_seconds == pytest.approx(1.55)
    assert t.backward_seconds == pytest.approx(0.60 - 0.10 - 0.01 - 0.40)
    assert t.hideable_seconds == pytest.approx(0.60 - 0.55 - 0.01)
    assert t.exposed_seconds == pytest.approx(1.00)
    # Without the exclusion it would read 0.53 s, and the slow link look like 2x compute.
    assert t.compute_seconds == pytest.approx(1.55 - 0.40 - 1.00 - 0.02)


def test_window_medians_per_bucket() -> None:
    clock = Clock()
    prof = StepProfiler(clock)
    for start, gap in ((0.0, 0.05), (1.0, 0.07), (2.0, 0.06)):
        clock.t = start
        prof.forward_done()
        prof.begin_step()
        for bucket, offset in ((0, 0.0), (1, gap)):
            clock.t = start + 0.1 + offset
            prof.hook_exited(prof.hook_entered(bucket))
    clock.t = 3.0
    prof.begin_step()
    window = prof.end_window()
    assert window is not None and window.steps == 3
    assert window.times.bucket_hideable_seconds == pytest.approx({0: 0.06, 1: 0.0})


class DeferredClock(Clock):
    """A device-like clock: stamps become readable only once ``completed`` passes them."""

    on_device = True

    def __init__(self) -> None:
        super().__init__()
        self.completed = 0.0

    def ready(self, stamps: Iterable[float | None]) -> bool:
        return all(s is None or s <= self.completed for s in stamps)


def test_device_steps_wait_for_their_stamps() -> None:
    """On a device clock a step whose stamps have not completed stays for the next window;
    nothing is lost and nothing blocks."""
    clock = DeferredClock()
    prof = StepProfiler(clock)
    for start in (0.0, 1.0):
        clock.t = start
        prof.begin_step()
        clock.t = start + 0.1
        prof.hook_exited(prof.hook_entered(0))
    clock.t = 2.0
    prof.begin_step()
    clock.completed = 1.5  # the device has finished step 0 only
    first = prof.end_window()
    assert first is not None and first.steps == 1
    clock.completed = 2.0
    second = prof.end_window()
    assert second is not None and second.steps == 1
    assert second.times.step_seconds == pytest.approx(1.0)
    assert prof.end_window() is None


def test_norms_read_once_per_window() -> None:
    """Sampled norms arrive as 0-d tensors and are read at the window's end."""
    clock = Clock()
    prof = StepProfiler(clock)
    prof.begin_step(sample=True)
    prof.hook_exited(prof.hook_entered(0))
    grad = torch.tensor([3.0, 4.0])
    prof.layer_sample(
        "w",
        "topk",
        grad_norm=torch.linalg.vector_norm(grad),
        residual_norm=torch.tensor(1.0),
        error=torch.tensor(1.0),
        x_norm=torch.tensor(4.0),
        nonzero=torch.tensor(0.25),
        grad_l1=float32_norm(grad, 1),
    )
    prof.layer_sample("b", "none", grad_norm=2.0)
    clock.t = 1.0
    prof.begin_step()
    window = prof.end_window()
    assert window is not None
    assert window.layer_samples["w"].grad_norm == pytest.approx(5.0)
    assert window.layer_samples["w"].residual_norm == pytest.approx(1.0)
    assert window.layer_samples["w"].rel_error == pytest.approx(0.25)
    assert window.layer_samples["b"].rel_error == pytest.approx(0.0)
    assert window.layer_samples["b"].spec == "none"
    assert window.layer_samples["w"].nonzero == pytest.approx(0.25)
    assert window.layer_samples["b"].nonzero == 1.0
    assert window.layer_samples["w"].grad_l1 == pytest.approx(7.0)
    assert window.layer_samples["b"].grad_l1 is None  # not measured, not zero


def test_l1_norm_accumulates_in_float32_and_reaches_the_window_as_a_mean_over_ranks() -> None:
    """``float32_norm(t, 1)`` is exact where float16 would overflow and for a float64
    gradient; the window vector carries each rank's L1 norm to the sum and ``layers``
    returns their mean, or None for a layer no rank measured it on (a caller that records
    no L1)."""
    half = torch.full((70_000,), 1.0, dtype=torch.float16)  # sum beyond float16's 65504
    assert float(float32_norm(half, 1)) == 70_000.0
    assert float32_norm(half, 1).dtype == torch.float32
    doubles = torch.tensor([-1.5, 2.0, 0.25], dtype=torch.float64)
    assert float(float32_norm(doubles, 1)) == 3.75

    names = ["w", "b"]
    vector = WindowVector(names)
    times = StepTimes(
        step_seconds=1.0,
        backward_seconds=0.5,
        hideable_seconds=0.2,
        comm_busy_seconds=0.3,
        compress_seconds=0.0,
        exposed_seconds=0.1,
    )

    def rank(l1: float) -> torch.Tensor:
        samples = {
            "w": LayerSample(
                grad_norm=2.0, residual_norm=0.0, rel_error=0.1, spec="int8", grad_l1=l1
            ),
            "b": LayerSample(grad_norm=1.0, residual_norm=0.0, rel_error=None, spec="none"),
        }
        profile = WindowProfile(
            steps=2, times=times, collectives=[], layer_seconds={}, layer_samples=samples
        )
        return vector.pack(profile, 0.0, 0, set(), {"w": 0, "b": 0})

    combined = rank(30.0) + rank(50.0)
    layers = vector.layers(combined, {"w": "int8", "b": "none"}, {"w": 0, "b": 0}, world=2)
    assert layers["w"].grad_l1 == pytest.approx(40.0)
    assert layers["w"].grad_norm == pytest.approx(2.0)
    assert layers["b"].grad_l1 is None


def test_nonzero_share_of_a_row_sparse_gradient() -> None:
    """The nonzero share is estimated from a strided sample of at most ``NONZERO_SAMPLE``
    elements: close to the true share of an embedding table's row-sparse gradient (rows of
    64 touched at random), exact for dense, all-zero and small tensors."""
    gen = torch.Generator().manual_seed(0)
    grad = torch.zeros(131_072, 64)
    rows = torch.randperm(131_072, generator=gen)[:800]
    grad[rows] = torch.randn(800, 64, generator=gen)
    share = nonzero_share(grad)
    assert share.dtype == torch.float32 and share.dim() == 0
    assert float(share) == pytest.approx(800 / 131_072, rel=0.15)
    assert float(nonzero_share(torch.randn(300, 7, generator=gen))) == 1.0
    assert float(nonzero_share(torch.zeros(1000))) == 0.0
    assert float(nonzero_share(torch.tensor([0.0, 1.0, 0.0, 2.0]))) == 0.5
    assert float(nonzero_share(torch.zeros(0))) == 1.0
    assert float(nonzero_share(torch.ones(10, dtype=torch.float64))) == 1.0


def test_layer_cost_is_per_closed_step_and_includes_the_decode() -> None:
    """A layer's cost is its hook work plus its decode in the completion callback, per step.
    The window ends at the first bucket of a new step (begun, not yet measured), so its
    costs are divided by the steps it closed: two here, not the three begun."""
    clock = Clock()
    prof = StepProfiler(clock)
    for step in range(2):
        base = 1.0 * step
        clock.t = base
        prof.begin_step()
        future = _hook_call(prof, clock, 0, base, base + 0.01, Collective.ALL_GATHER, 100)
        prof.layer_cost("fc.weight", base)  # compress: 0.01 s in the hook call
        _done(clock, future, base + 0.05)
        decode_started = prof.stamp()
        clock.t = base + 0.07
        prof.layer_cost("fc.weight", decode_started)  # decode: 0.02 s in the callback
    clock.t = 2.0
    prof.begin_step()  # the boundary: step 2 begins, steps 0 and 1 are closed
    window = prof.end_window()
    assert window is not None and window.steps == 2
    assert window.layer_seconds["fc.weight"] == pytest.approx(0.03)
