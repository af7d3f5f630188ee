"""In-process profiler: one rank's step timeline, fed by the comm hook and the controller.

What it measures, per step:

- when gradient buckets become ready (the hook is called the moment DDP launches a bucket),
  and the time the hook itself spends compressing and launching;
- each collective's bytes and *service* time: from when it could start on the wire (its
  launch, or the previous collective's completion if that was later) to its completion, so a
  collective queued behind another is not charged for the wait;
- the compression cost per layer (compress, error-feedback decode, decode of what arrived);
- on sampled steps, per-layer gradient and residual norms and the relative error of the
  compressor in use.

From these a window summary gives the quantities the policy needs (backward time, the part of
it communication can hide behind, link busy time, exposed communication and overlap, with the
definitions of :mod:`autocomp.exposure`, shared with the policy engine and the advisor) and
the raw samples for the bandwidth fit and the cost model.

Cost: a few ``perf_counter`` calls and dict updates per layer per step; norms only on sampled
steps (one in ``window``).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from autocomp.compressors import Collective
from autocomp.exposure import compute_seconds, measured_exposed, overlap

now = time.perf_counter


@dataclass(slots=True)
class CollectiveRecord:
    """One collective issued by the hook."""

    kind: Collective
    payload_bytes: int
    launched: float
    done: float | None = None


@dataclass(slots=True)
class LayerSample:
    """Norms and error of one layer on a sampled step (this rank, before averaging)."""

    grad_norm: float
    residual_norm: float
    rel_error: float | None
    spec: str


@dataclass(slots=True)
class _Step:
    started: float
    forward_done: float | None = None
    first_ready: float | None = None
    last_ready: float | None = None
    last_hook_exit: float | None = None
    hook_seconds_before_last: float = 0.0
    last_hook_seconds: float = 0.0
    last_finished: float | None = None
    finish_seconds: float = 0.0
    wait_seconds: float = 0.0
    """Time hook calls blocked on an earlier collective (two-round compressors)."""
    collectives: list[CollectiveRecord] = field(default_factory=list)
    ready_compute: dict[int, float] = field(default_factory=dict)
    """Bucket index -> when it became ready, with the hook's earlier work taken out."""


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Timeline summary of one completed step on this rank (seconds)."""

    step_seconds: float
    """From this step's forward start to the next one's: the full iteration."""
    backward_seconds: float
    """Forward end to the last bucket ready, minus the hook's own work."""
    hideable_seconds: float
    """Backward compute after the first bucket is ready: what communication can hide behind."""
    comm_busy_seconds: float
    """Sum of collective service times: the link's busy time."""
    compress_seconds: float
    """Hook work (compress + launch) plus decode in completion callbacks; hook time spent
    waiting for an earlier collective is not work and is left out."""
    exposed_seconds: float
    """Communication and decode still running after backward compute ended, plus the time
    hook calls blocked the backward waiting for an earlier collective."""
    bucket_hideable_seconds: dict[int, float] = field(default_factory=dict)
    """Per bucket index: backward compute left once that bucket is ready (the last one: 0).
    What its communication can hide behind; the first bucket's is ``hideable_seconds``."""
    compute_seconds: float = 0.0
    """The step without what communication added (:func:`autocomp.exposure.compute_seconds`);
    for a window, the minimum over its steps: anything else that lands in a step (an
    evaluation, a checkpoint, a slow data batch) only makes steps longer."""

    @property
    def overlap(self) -> float:
        """Fraction of communication (incl. compression) hidden behind backward compute."""
        return overlap(self.exposed_seconds, self.comm_busy_seconds, self.compress_seconds)


@dataclass(frozen=True, slots=True)
class WindowProfile:
    """What one rank measured over a window of steps."""

    steps: int
    times: StepTimes
    """Median over the window's complete steps."""
    collectives: list[list[tuple[Collective, int, float]]]
    """Per completed step: (kind, payload bytes, service seconds) of each finished collective.
    Service intervals never overlap, so a step's seconds add up to the link's busy time."""
    layer_seconds: dict[str, float]
    """Mean hook cost per step per compressed layer."""
    layer_samples: dict[str, LayerSample]
    """Norms/errors averaged over the window's sampled steps (RMS for norms)."""


def _mean_sample(samples: list[LayerSample]) -> LayerSample:
    count = len(samples)
    errors = [s.rel_error for s in samples if s.rel_error is not None]
    return LayerSample(
        grad_norm=(sum(s.grad_norm**2 for s in samples) / count) ** 0.5,
        residual_norm=(sum(s.residual_norm**2 for s in samples) / count) ** 0.5,
        rel_error=sum(errors) / len(errors) if errors else None,
        spec=samples[-1].spec,
    )


def _service_times(records: list[CollectiveRecord]) -> list[tuple[CollectiveRecord, float]]:
    done = sorted((r for r in records if r.done is not None), key=lambda r: r.done or 0.0)
    out = []
    previous_done = float("-inf")
    for record in done:
        assert record.done is not None
        start = max(record.launched, previous_done)
        out.append((record, max(0.0, record.done - start)))
        previous_done = record.done
    return out


class StepProfiler:
    """Collects one rank's measurements; thread-safe where collectives complete off-thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: _Step | None = None
        self._forward_done: float | None = None
        self._finished: list[tuple[_Step, float]] = []
        self._layer_seconds: dict[str, float] = defaultdict(float)
        self._layer_samples: dict[str, list[LayerSample]] = {}
        self.sample_this_step = False
        """Set by the controller: the hook records norms and errors on this step."""

    # ---- controller side ------------------------------------------------------------------

    def begin_step(self, sample: bool = False) -> None:
        """Called when a step's first gradient bucket reaches the comm hook (before any of its
        collectives): it closes the previous step, whose length is the time between the two
        calls. The last forward that ended before it (if the caller reports forwards) marks
        where this step's backward began."""
        t = now()
        with self._lock:
            if self._current is not None and self._current.last_ready is not None:
                self._finished.append((self._current, t))
            forward_done = self._forward_done
            self._current = _Step(started=t, forward_done=forward_done)
            self._forward_done = None
        self.sample_this_step = sample

    def forward_done(self) -> None:
        """A training forward ended (the backward that follows belongs to the next step)."""
        self._forward_done = now()

    # ---- hook side ------------------------------------------------------------------------

    def hook_entered(self, bucket_index: int | None = None) -> float:
        t = now()
        step = self._current
        if step is not None:
            if step.first_ready is None:
                step.first_ready = t
            if step.last_hook_exit is not None:
                step.hook_seconds_before_last += step.last_hook_seconds
            step.last_ready = t
            if bucket_index is not None:
                step.ready_compute[bucket_index] = t - step.hook_seconds_before_last
        return t

    def hook_exited(self, entered: float) -> None:
        t = now()
        step = self._current
        if step is not None:
            step.last_hook_exit = t
            step.last_hook_seconds = t - entered

    def collective(
        self, kind: Collective, payload_bytes: int, future: torch.futures.Future
    ) -> None:
        step = self._current
        if step is None:
            return
        record = CollectiveRecord(kind, payload_bytes, now())
        step.collectives.append(record)

        def mark(_: torch.futures.Future) -> None:
            record.done = now()

        future.add_done_callback(mark)

    def link_wait(self, seconds: float) -> None:
        """A hook call blocked ``seconds`` waiting for an earlier bucket's collective.

        Part of the hook's time but neither compression work nor backward compute: the
        backward stood still for the link, so it counts as exposed communication.
        """
        step = self._current
        if step is not None:
            step.wait_seconds += seconds

    def bucket_finished(self, seconds: float) -> None:
        """A completion callback finished decoding a bucket (``seconds`` of decode work)."""
        step = self._current
        if step is not None:
            with self._lock:
                step.finish_seconds += seconds
                step.last_finished = now()

    def layer_cost(self, name: str, seconds: float) -> None:
        """Add hook work done for one layer (compress, decode) in the current step."""
        self._layer_seconds[name] += seconds

    def layer_sample(self, name: str, sample: LayerSample) -> None:
        """Record one sampled step's norms for a layer; the window reports their mean."""
        self._layer_samples.setdefault(name, []).append(sample)

    # ---- window ---------------------------------------------------------------------------

    def _summarize(self, step: _Step, next_start: float) -> StepTimes | None:
        if step.first_ready is None or step.last_ready is None:
            return None
        # Without a reported forward end, the backward counts from the first bucket ready.
        forward_done = step.forward_done or step.first_ready
        last_exit = step.last_hook_exit or step.last_ready
        backward = max(0.0, step.last_ready - forward_done - step.hook_seconds_before_last)
        hideable = max(0.0, step.last_ready - step.first_ready - step.hook_seconds_before_last)
        services = _service_times(step.collectives)
        busy = sum(s for _, s in services)
        ends = [r.done for r, _ in services if r.done is not None]
        if step.last_finished is not None:
            ends.append(step.last_finished)
        exposed = measured_exposed(last_exit, ends, step.wait_seconds)
        hook_work = step.hook_seconds_before_last + step.last_hook_seconds - step.wait_seconds
        last_compute = step.last_ready - step.hook_seconds_before_last
        step_seconds = next_start - step.started
        work = max(0.0, hook_work) + step.finish_seconds
        return StepTimes(
            compute_seconds=compute_seconds(step_seconds, exposed, work, backward),
            step_seconds=step_seconds,
            backward_seconds=backward,
            hideable_seconds=hideable,
            comm_busy_seconds=busy,
            compress_seconds=work,
            exposed_seconds=exposed,
            bucket_hideable_seconds={
                index: max(0.0, last_compute - ready) for index, ready in step.ready_compute.items()
            },
        )

    def end_window(self) -> WindowProfile | None:
        """Summarize the steps completed since the last call and start a new window."""
        with self._lock:
            finished, self._finished = self._finished, []
        summaries = [s for s in (self._summarize(st, nxt) for st, nxt in finished) if s]
        collectives = [
            [(r.kind, r.payload_bytes, seconds) for r, seconds in _service_times(st.collectives)]
            for st, _ in finished
        ]
        steps = max(1, len(finished))
        layer_seconds = {name: total / steps for name, total in self._layer_seconds.items()}
        samples = {name: _mean_sample(items) for name, items in self._layer_samples.items()}
        self._layer_seconds.clear()
        self._layer_samples.clear()
        if not summaries:
            return None

        def median(attr: str) -> float:
            return statistics.median(getattr(s, attr) for s in summaries)

        buckets = {index for s in summaries for index in s.bucket_hideable_seconds}
        times = StepTimes(
            step_seconds=median("step_seconds"),
            backward_seconds=median("backward_seconds"),
            hideable_seconds=median("hideable_seconds"),
            comm_busy_seconds=median("comm_busy_seconds"),
            compress_seconds=median("compress_seconds"),
            exposed_seconds=median("exposed_seconds"),
            compute_seconds=min(s.compute_seconds for s in summaries),
            bucket_hideable_seconds={
                index: statistics.median(
                    s.bucket_hideable_seconds[index]
                    for s in summaries
                    if index in s.bucket_hideable_seconds
                )
                for index in sorted(buckets)
            },
        )
        return WindowProfile(len(summaries), times, collectives, layer_seconds, samples)
