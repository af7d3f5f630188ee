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

Every time point is a stamp of a :mod:`autocomp.timing` clock (host time on CPU, CUDA events on
GPUs), read once per window; the norms stay device tensors until then, and the window reads
them with one transfer. The hot path therefore never waits for the device.

Cost: a few stamps and list appends per layer per step (on CUDA, per-layer costs are timed on
sampled steps only, to keep the events few); norms only on sampled steps.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from autocomp import callbacks
from autocomp.compressors import Collective
from autocomp.exposure import compute_seconds, measured_exposed, overlap
from autocomp.timing import Clock, HostClock, Stamp

Norm = float | torch.Tensor
"""A norm as the hook computes it: a 0-d device tensor (read at the window's end) or a float."""


@dataclass(slots=True)
class CollectiveRecord:
    """One collective issued by the hook."""

    kind: Collective
    payload_bytes: int
    launched: Stamp
    done: Stamp | None = None


@dataclass(slots=True)
class LayerSample:
    """Norms and error of one layer on a sampled step (this rank, before averaging)."""

    grad_norm: float
    residual_norm: float
    rel_error: float | None
    spec: str
    nonzero: float = 1.0
    """Fraction of the gradient's elements that are nonzero (estimated from a sample)."""
    grad_l1: float | None = None
    """L1 norm of the gradient (None: not measured by this sample's caller)."""
    sketches: list[tuple[int, list[float]]] = field(default_factory=list)
    """Per sampled step that made one, in step order: (step, the sketches of what the
    compressor lost and of its input, concatenated) (:mod:`autocomp.error_sketch`). Kept per
    step: the ranks' sum must be squared step by step (summed over steps first, the cross
    terms between steps leave the spread of one sketch however many steps there are)."""


@dataclass(slots=True)
class _PendingSample:
    name: str
    spec: str
    grad_norm: Norm
    residual_norm: Norm
    error: Norm
    """Norm of what the compressor lost (``x - estimate``); over ``x_norm`` the relative error."""
    x_norm: Norm
    nonzero: Norm = 1.0
    grad_l1: Norm | None = None
    sketch: torch.Tensor | None = None
    sketch_step: int = 0


@dataclass(slots=True)
class HookCall:
    """One hook call's stamps (what :meth:`StepProfiler.hook_entered` hands back)."""

    bucket_index: int | None
    entered: Stamp
    exited: Stamp | None = None


@dataclass(slots=True)
class _Step:
    started: Stamp
    forward_done: Stamp | None = None
    hooks: list[HookCall] = field(default_factory=list)
    waits: list[tuple[Stamp, Stamp]] = field(default_factory=list)
    """Hook time blocked on an earlier collective (two-round compressors)."""
    finishes: list[tuple[Stamp, Stamp]] = field(default_factory=list)
    """Decode work in completion callbacks."""
    collectives: list[CollectiveRecord] = field(default_factory=list)
    controller: list[tuple[Stamp, Stamp]] = field(default_factory=list)
    """The controller's own work on this step (the opening, a window boundary)."""

    def stamps(self) -> Iterator[Stamp | None]:
        yield self.started
        yield self.forward_done
        for call in self.hooks:
            yield call.entered
            yield call.exited
        for pair in (*self.waits, *self.finishes, *self.controller):
            yield from pair
        for record in self.collectives:
            yield record.launched
            yield record.done


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
    l1s = [s.grad_l1 for s in samples if s.grad_l1 is not None]
    return LayerSample(
        grad_norm=(sum(s.grad_norm**2 for s in samples) / count) ** 0.5,
        residual_norm=(sum(s.residual_norm**2 for s in samples) / count) ** 0.5,
        rel_error=sum(errors) / len(errors) if errors else None,
        spec=samples[-1].spec,
        nonzero=sum(s.nonzero for s in samples) / count,
        grad_l1=sum(l1s) / len(l1s) if l1s else None,
        sketches=sorted(item for s in samples for item in s.sketches),
    )


def _read_norms(pending: list[_PendingSample]) -> list[LayerSample]:
    """The samples as floats: every device norm and sketch read in one transfer."""
    tensors = [
        value
        for p in pending
        for value in (p.grad_norm, p.residual_norm, p.error, p.x_norm, p.nonzero, p.grad_l1)
        if isinstance(value, torch.Tensor)
    ]
    sketches = [p.sketch for p in pending if p.sketch is not None]
    parts = [t.detach().float().reshape(1) for t in tensors]
    parts += [t.detach().float().reshape(-1) for t in sketches]
    read: Iterator[float] = iter(torch.cat(parts).tolist() if parts else [])

    def value(norm: Norm) -> float:
        return next(read) if isinstance(norm, torch.Tensor) else float(norm)

    out = []
    for p in pending:
        grad, residual, error, x_norm, nonzero = (
            value(p.grad_norm),
            value(p.residual_norm),
            value(p.error),
            value(p.x_norm),
            value(p.nonzero),
        )
        l1 = None if p.grad_l1 is None else value(p.grad_l1)
        rel = error / x_norm if x_norm > 0 else 0.0
        out.append(LayerSample(grad, residual, rel, p.spec, nonzero, l1))
    for p, sample in zip(pending, out, strict=True):  # the sketches follow every norm
        if p.sketch is not None:
            sample.sketches = [(p.sketch_step, [next(read) for _ in range(p.sketch.numel())])]
    return out


def _service_times(
    records: list[CollectiveRecord], read: Callable[[Stamp], float]
) -> list[tuple[CollectiveRecord, float]]:
    done = sorted(
        ((r, read(r.launched), read(r.done)) for r in records if r.done is not None),
        key=lambda item: item[2],
    )
    out = []
    previous_done = float("-inf")
    for record, launched, finished in done:
        start = max(launched, previous_done)
        out.append((record, max(0.0, finished - start)))
        previous_done = finished
    return out


class StepProfiler:
    """Collects one rank's measurements; thread-safe where collectives complete off-thread."""

    def __init__(self, clock: Clock | None = None, *, blocking: bool = False) -> None:
        self.clock: Clock = clock or HostClock()
        self.blocking = blocking
        """The hook returns only once its collectives are done (FSDP's all-reduce hook): no
        communication hides behind the backward, so nothing is hideable."""
        self._lock = threading.Lock()
        self._current: _Step | None = None
        self._forward_done: Stamp | None = None
        self._finished: list[tuple[_Step, Stamp]] = []
        self._layer_costs: list[tuple[str, Stamp, Stamp]] = []
        self._timed_steps = 0
        """Closed steps whose layers were timed: a window's layer costs are those of the steps
        it closed (a step's decode completes after the step began, the boundary runs at the
        start of the next), so the mean divides by these, not by the steps begun."""
        self._current_timed = False
        self._samples: list[_PendingSample] = []
        self.sample_this_step = False
        """Set by the controller: the hook records norms and errors on this step."""

    @property
    def time_layers(self) -> bool:
        """Whether the hook times each layer's work this step (every step on the host; on a
        device only on sampled steps, to keep the events few)."""
        return self.sample_this_step or not self.clock.on_device

    def stamp(self) -> Stamp:
        return self.clock.stamp()

    # ---- controller side ------------------------------------------------------------------

    def begin_step(self, sample: bool = False) -> None:
        """Called when a step's first gradient bucket reaches the comm hook (before any of its
        collectives): it closes the previous step, whose length is the time between the two
        calls. The last forward that ended before it (if the caller reports forwards) marks
        where this step's backward began."""
        t = self.clock.stamp()
        with self._lock:
            if self._current is not None and self._current.hooks:
                self._finished.append((self._current, t))
            self._current = _Step(started=t, forward_done=self._forward_done)
            self._forward_done = None
        if self._current_timed:
            self._timed_steps += 1
        self.sample_this_step = sample
        self._current_timed = self.time_layers

    def forward_done(self) -> None:
        """A training forward ended (the backward that follows belongs to the next step)."""
        self._forward_done = self.clock.stamp()

    # ---- hook side ------------------------------------------------------------------------

    @property
    def current_step(self) -> _Step | None:
        """The step being recorded, for work that completes after the next one began."""
        return self._current

    def hook_entered(self, bucket_index: int | None = None) -> HookCall:
        call = HookCall(bucket_index, self.clock.stamp())
        if self._current is not None:
            self._current.hooks.append(call)
        return call

    def hook_exited(self, call: HookCall) -> None:
        call.exited = self.clock.stamp()

    def collective(
        self, kind: Collective, payload_bytes: int, future: torch.futures.Future
    ) -> None:
        """Record a collective just launched; a callback on ``future`` stamps its end."""
        record = self.launched(kind, payload_bytes)
        if record is None:
            return
        clock = self.clock

        def mark(_: torch.futures.Future) -> None:
            # A completion callback: on CUDA it runs on a stream that waits for the
            # collective, so the event completes with the transfer, not its enqueue.
            record.done = clock.stamp()

        callbacks.add_done_callback(future, mark)

    def launched(self, kind: Collective, payload_bytes: int) -> CollectiveRecord | None:
        """Record a collective just launched, for a caller that stamps its end itself
        (``record.done = profiler.stamp()``) in a callback it already puts on the future:
        each Python callback costs the worker thread a turn of the GIL. None outside a step."""
        step = self._current
        if step is None:
            return None
        record = CollectiveRecord(kind, payload_bytes, self.clock.stamp())
        step.collectives.append(record)
        return record

    def controller_work(self, started: Stamp) -> None:
        """The controller worked on this step from ``started`` until now (the opening's probes,
        a window boundary's exchange and decision).

        That time is neither the model's compute nor its gradients' communication, and it is
        paid once, not every step: left in, the opening at 35 Mbit/s made step 0's backward
        read 0.49 s against 0.06 s steady, and the glance took communication for a small part
        of the step. The step's length keeps it (the run was that much slower); the
        backward and the compute-only reading leave it out.
        """
        step = self._current
        if step is not None:
            step.controller.append((started, self.clock.stamp()))

    def link_wait(self, started: Stamp) -> None:
        """A hook call blocked from ``started`` until now, waiting for an earlier bucket's
        collective.

        Part of the hook's time but neither compression work nor backward compute: the
        backward stood still for the link, so it counts as exposed communication.
        """
        step = self._current
        if step is not None:
            step.waits.append((started, self.clock.stamp()))

    def bucket_finished(self, started: Stamp, step: _Step | None = None) -> None:
        """A completion callback decoded a bucket from ``started`` until now, for ``step``
        (default: the current one)."""
        ended = self.clock.stamp()
        target = step if step is not None else self._current
        if target is not None:
            with self._lock:
                target.finishes.append((started, ended))

    def layer_cost(self, name: str, started: Stamp) -> None:
        """Hook work for one layer (compress, decode) from ``started`` until now (the decode
        runs in a completion callback, possibly on another thread)."""
        ended = self.clock.stamp()
        with self._lock:
            self._layer_costs.append((name, started, ended))

    def shared_cost(self, layers: Sequence[tuple[str, int]], started: Stamp) -> None:
        """Hook work done for several layers at once (a cast span,
        :mod:`autocomp.hook_cast_span`) from ``started`` until now, shared out by their sizes
        (``(name, elements)``) so that each layer's cost stays measured. Host stamps only: a
        device clock times layers only on sampled steps, which never share work."""
        ended = self.clock.stamp()
        if not isinstance(started, float) or not isinstance(ended, float):
            return
        total = sum(size for _, size in layers)
        if total <= 0:
            return
        span = ended - started
        costs = []
        at = started
        for name, size in layers:
            until = at + span * size / total
            costs.append((name, at, until))
            at = until
        with self._lock:
            self._layer_costs.extend(costs)

    def layer_sample(
        self,
        name: str,
        spec: str,
        *,
        grad_norm: Norm,
        residual_norm: Norm = 0.0,
        error: Norm = 0.0,
        x_norm: Norm = 0.0,
        nonzero: Norm = 1.0,
        grad_l1: Norm | None = None,
        sketch: torch.Tensor | None = None,
        sketch_step: int = 0,
    ) -> None:
        """Record one sampled step's norms for a layer (device tensors are read at the window's
        end); the window reports their mean."""
        self._samples.append(
            _PendingSample(
                name,
                spec,
                grad_norm,
                residual_norm,
                error,
                x_norm,
                nonzero,
                grad_l1,
                sketch,
                sketch_step,
            )
        )

    # ---- window ---------------------------------------------------------------------------

    def _summarize(
        self, step: _Step, next_start: Stamp, read: Callable[[Stamp], float]
    ) -> StepTimes | None:
        if not step.hooks:
            return None
        entered = [read(c.entered) for c in step.hooks]
        exited = [
            read(c.exited) if c.exited is not None else at
            for c, at in zip(step.hooks, entered, strict=True)
        ]
        durations = [x - e for e, x in zip(entered, exited, strict=True)]
        first_ready, last_ready = entered[0], entered[-1]
        hook_before_last = sum(durations[:-1])
        # Without a reported forward end, the backward counts from the first bucket ready.
        forward_done = read(step.forward_done) if step.forward_done is not None else first_ready
        waits = sum(read(b) - read(a) for a, b in step.waits)
        controller = [(read(a), read(b)) for a, b in step.controller]
        controller_seconds = sum(b - a for a, b in controller)

        def controller_within(start: float, end: float) -> float:
            return sum(max(0.0, min(b, end) - max(a, start)) for a, b in controller)

        backward = max(
            0.0,
            last_ready
            - forward_done
            - hook_before_last
            - controller_within(forward_done, last_ready),
        )
        hideable = (
            0.0
            if self.blocking
            else max(
                0.0,
                last_ready
                - first_ready
                - hook_before_last
                - controller_within(first_ready, last_ready),
            )
        )
        services = _service_times(step.collectives, read)
        busy = sum(s for _, s in services)
        ends = [read(r.done) for r, _ in services if r.done is not None]
        ends.extend(read(b) for _, b in step.finishes)
        exposed = measured_exposed(exited[-1], ends, waits)
        hook_work = sum(durations) - waits
        finish_seconds = sum(read(b) - read(a) for a, b in step.finishes)
        last_compute = last_ready - hook_before_last
        ready_compute: dict[int, float] = {}
        before = 0.0
        for call, at, spent in zip(step.hooks, entered, durations, strict=True):
            if call.bucket_index is not None:
                ready_compute[call.bucket_index] = at - before
            before += spent
        step_seconds = read(next_start) - read(step.started)
        work = max(0.0, hook_work) + finish_seconds
        return StepTimes(
            compute_seconds=compute_seconds(
                step_seconds - controller_seconds, exposed, work, backward
            ),
            step_seconds=step_seconds,
            backward_seconds=backward,
            hideable_seconds=hideable,
            comm_busy_seconds=busy,
            compress_seconds=work,
            exposed_seconds=exposed,
            bucket_hideable_seconds={
                index: 0.0 if self.blocking else max(0.0, last_compute - ready)
                for index, ready in ready_compute.items()
            },
        )

    def end_window(self) -> WindowProfile | None:
        """Summarize the steps completed since the last call and start a new window.

        On a device clock, a step whose events have not all completed yet (the device runs
        behind the host) stays for the next window: nothing here waits for the device.
        """
        clock = self.clock
        with self._lock:
            finished, self._finished = self._finished, []
            ready = [(s, n) for s, n in finished if clock.ready([*s.stamps(), n])]
            self._finished = [(s, n) for s, n in finished if not clock.ready([*s.stamps(), n])]
            costs, self._layer_costs = self._layer_costs, []
        ready_costs = [c for c in costs if clock.ready(c[1:])]
        with self._lock:
            self._layer_costs[:0] = [c for c in costs if not clock.ready(c[1:])]
        timed_steps, self._timed_steps = max(1, self._timed_steps), 0
        samples: dict[str, list[LayerSample]] = {}
        for pending, sample in zip(self._samples, _read_norms(self._samples), strict=True):
            samples.setdefault(pending.name, []).append(sample)
        self._samples = []
        layer_seconds: dict[str, float] = {}
        for name, start, end in ready_costs:
            read = clock.reader(start)
            layer_seconds[name] = layer_seconds.get(name, 0.0) + (read(end) - read(start))
        layer_seconds = {name: total / timed_steps for name, total in layer_seconds.items()}
        layer_samples = {name: _mean_sample(items) for name, items in samples.items()}
        if not ready:
            return None
        read = clock.reader(ready[0][0].started)
        summaries = [s for s in (self._summarize(st, nxt, read) for st, nxt in ready) if s]
        collectives = [
            [(r.kind, r.payload_bytes, sec) for r, sec in _service_times(st.collectives, read)]
            for st, _ in ready
        ]
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
        return WindowProfile(len(summaries), times, collectives, layer_seconds, layer_samples)
