"""One DDP model of a profiled script, measured with autocomp's own hook and profiler.

The advisor predicts what autocomp would do on another link, so it measures the script the
way autocomp measures a training run: the step timeline (bucket readiness with the hook's
own time taken out, collective completion, exposed communication, the step's length) is
kept by a :class:`~autocomp.profiler.StepProfiler` per model, the one the adaptive
controller uses, with the definitions of :mod:`autocomp.exposure`. What feeds it:

* **No comm hook of the script's own** (the usual case): before the model's first forward,
  autocomp's comm hook (:func:`autocomp.hook.autocomp_hook`) is registered with every layer
  uncompressed -- one all-reduce of the averaged bucket, what DDP does by default -- and the
  profiler attached to its :class:`~autocomp.hook_state.HookState`. The hook reports each bucket
  and collective itself, and its ``step_listener`` marks where each step begins.
* **autocomp's hook in static mode** (``autocomp.wrap(ddp, plan=...)``): the profiler is
  attached to the script's own hook state the same way, so compression work, decode and the
  waits of two-round compressors are told apart as in a training run.
* **Any other Python comm hook** (PowerSGD's, fp16's, ``autocomp.wrap`` in adaptive mode,
  whose state already has a profiler of its own): the hook is opaque, so the calls around it
  are reported to the profiler the way autocomp's hook reports its own -- the first bucket
  of a step begins it, each call is entered and exited, and the future it returns is the
  bucket's collective.

Two things the profiler does not know are kept here: how long the forward ran (the profiler
only marks where it ended), and the bucket layout and gradients, which the advisor records
for the profile (names per bucket, gradient norms, one real gradient per shape for the
compressor costs).

Steps run from one first bucket to the next, as the profiler counts them, so a step's time
is a whole iteration (forward, backward, optimizer step) only once the next step began; the
last step before the script stops or ends is closed at that point and only its backward,
exposed and hook times are used.
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from autocomp import callbacks
from autocomp.advisor.costs import eligible
from autocomp.advisor.profile import BucketInfo, LayerInfo, ModelProfile, Timing
from autocomp.attach import ddp_ignored_names, sparse_gradient_names
from autocomp.compressors import Collective
from autocomp.hook import autocomp_hook, sparse_bytes
from autocomp.hook_layer import LayerSlot, bucket_shape, nonzero_share
from autocomp.hook_state import HookState
from autocomp.profiler import StepProfiler, StepTimes

if TYPE_CHECKING:
    from autocomp.advisor.session import CaptureSession

logger = logging.getLogger(__name__)

__all__ = ["BucketLayout", "ModelCapture", "StepRecord"]

now = time.perf_counter

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future]


@dataclass(frozen=True, slots=True)
class BucketLayout:
    """A bucket's parameters as DDP hands them to the comm hook."""

    key: tuple[int, ...]
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    nbytes: int


@dataclass(slots=True)
class StepRecord:
    """One step of one model: the profiler's timeline plus what only the capture knows."""

    forward_s: float = 0.0
    """Training forwards since the previous backward (a GAN's discriminator runs two)."""
    layouts: dict[int, BucketLayout] = field(default_factory=dict)
    """Bucket index -> layout, as handed to the hook in this step."""
    complete: bool = False
    """The last bucket of the backward was handed to the hook."""
    times: StepTimes | None = None
    """The profiler's summary, once the step is closed."""
    whole: bool = False
    """Closed by the next step's first bucket: ``times.step_seconds`` is a whole iteration."""


@dataclass(frozen=True, slots=True)
class _StepMetrics:
    """Profile quantities of one step (``docs/advisor.md``), hook time removed."""

    forward_s: float
    backward_s: float
    first_ready_s: float
    hideable_s: float
    step_s: float
    exposed_s: float
    hook_s: float
    ready: dict[int, float]
    whole: bool


def _metrics(step: StepRecord) -> _StepMetrics | None:
    """The profile's per-step quantities from the profiler's timeline of one step."""
    times = step.times
    if not step.complete or times is None:
        return None
    backward = times.backward_seconds
    hook = times.compress_seconds
    exposed = times.exposed_seconds
    # Without the next step, the step ends with its last collective: forward, backward, hook
    # work and the exposed tail, without the optimizer step.
    step_s = times.step_seconds if step.whole else step.forward_s + backward + hook + exposed
    return _StepMetrics(
        forward_s=step.forward_s,
        backward_s=backward,
        first_ready_s=max(0.0, backward - times.hideable_seconds),
        hideable_s=times.hideable_seconds,
        step_s=step_s,
        exposed_s=exposed,
        hook_s=hook,
        ready={i: max(0.0, backward - h) for i, h in times.bucket_hideable_seconds.items()},
        whole=step.whole,
    )


def _timed(metrics: list[_StepMetrics]) -> list[_StepMetrics]:
    """The steps that time a whole iteration: those the next step followed (else all of them).

    A step without a following one ends at its last collective, without the optimizer step;
    mixing both kinds would compare different intervals.
    """
    return [m for m in metrics if m.whole] or metrics


class ModelCapture:
    """Timeline, bucket layout and first-step gradients of one DDP model."""

    def __init__(self, ddp: DistributedDataParallel, index: int, session: CaptureSession) -> None:
        self.ddp: DistributedDataParallel | None = ddp
        self.index = index
        self.session = session
        self.module_class = type(ddp.module).__name__
        ignored = ddp_ignored_names(ddp, ddp.module)
        self.params = [
            (n, p) for n, p in ddp.module.named_parameters() if p.requires_grad and n not in ignored
        ]
        self.names = {id(p): n for n, p in self.params}
        self.profiler = StepProfiler()
        """This model's step timeline (one window per step: see :meth:`_step_started`)."""
        self.hook_state: HookState | None = None
        """The autocomp hook state the profiler is attached to (None for an opaque hook)."""
        self.hook_installed = False
        self.hook_timed = False
        """A timed comm hook is registered, so this model's backwards are seen and counted."""
        self.hook_note: str | None = None
        self.steps: list[StepRecord] = []
        self.current: StepRecord | None = None
        self.backwards = 0
        """Completed backwards (last bucket handed to the hook): this model's steps."""
        self.grad_norms: dict[str, float] = {}
        """Norm of each parameter's averaged gradient in the first step where it is not zero."""
        self.grad_l1s: dict[str, float] = {}
        """The L1 norm of that same gradient."""
        self.nonzero_shares: dict[str, float] = {}
        """The nonzero share of that same gradient (``hook_layer.nonzero_share``)."""
        self._unseen: set[str] = set()
        self.samples: dict[tuple[int, ...], torch.Tensor] = {}
        """One real averaged gradient per eligible shape (rank 0), for the compressor costs;
        a zero one (a parameter unused in that step) is replaced by the next non-zero one."""
        self._zero_samples: set[tuple[int, ...]] = set()
        self.sparse = set(sparse_gradient_names(ddp.module, dict(self.params)))
        """Parameters with sparse gradients (embeddings with ``sparse=True``)."""
        self.sparse_bytes: dict[str, list[int]] = {}
        """Per step, the bytes of values and indices each sparse gradient held (rank 0's)."""
        self._layouts: dict[int, BucketLayout] = {}
        self._forward_started = 0.0
        self._pending_forward_s = 0.0
        self._in_step = False
        ddp.register_forward_pre_hook(self._pre_forward)
        ddp.register_forward_hook(self._post_forward)

    # ---- step boundaries ---------------------------------------------------------------------

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled():
            return  # evaluation: no gradient sync, not a step boundary
        self.session.maybe_stop()
        if not self.hook_installed:
            self.session.install_default_hook(self)
        self._forward_started = now()

    def _post_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.is_grad_enabled():
            self._pending_forward_s += now() - self._forward_started
            self.profiler.forward_done()

    def _step_started(self) -> None:
        """A step's first bucket reached the hook (before its collectives): the profiler
        closes the previous step, which becomes a window of its own, and a new one begins."""
        self._close(whole=True)
        self.current = StepRecord(forward_s=self._pending_forward_s)
        self._pending_forward_s = 0.0
        self.steps.append(self.current)

    def _close(self, *, whole: bool) -> None:
        self.profiler.begin_step()
        window = self.profiler.end_window()
        step = self.current
        if step is not None and step.times is None and window is not None:
            step.times, step.whole = window.times, whole

    def finish(self) -> None:
        """The script stopped or ended: close the last step (not a whole iteration)."""
        self._close(whole=False)

    # ---- the comm hook -----------------------------------------------------------------------

    def install_default_hook(self, register: Callable[..., Any]) -> None:
        """Register autocomp's hook, every layer uncompressed, with the profiler attached.

        ``register`` is DDP's own ``register_comm_hook`` (the session wraps the public one).
        """
        ddp = self.ddp
        assert ddp is not None  # released only after the script
        group = ddp.process_group
        slots = {
            name: LayerSlot(name=name, shape=shape, dtype=dtype, seed=0)
            for name, p in self.params
            for shape, dtype in [bucket_shape(p)]
        }
        state = HookState(
            group,
            slots,
            dict(self.names),
            rank=dist.get_rank(group),
            world_size=dist.get_world_size(group),
            check_wire_bytes=False,
        )
        self._attach(state)
        register(ddp, state, self.observed(autocomp_hook, reports_itself=True))

    def adopt(self, state: object, hook: Hook) -> Hook:
        """The script's own ``(state, hook)``, instrumented; its behaviour is unchanged."""
        if (
            hook is autocomp_hook
            and isinstance(state, HookState)
            and state.profiler is None
            and state.step_listener is None
        ):
            self._attach(state)
            return self.observed(hook, reports_itself=True)
        return self.observed(hook, reports_itself=False)

    def _attach(self, state: HookState) -> None:
        state.profiler = self.profiler
        state.step_listener = lambda _step: self._step_started()
        self.hook_state = state

    def observed(self, inner: Hook, *, reports_itself: bool) -> Hook:
        """``inner`` wrapped to record layouts and gradients and to count backwards.

        Unless ``inner`` reports to the profiler itself (autocomp's hook with the profiler
        attached), the calls around it are reported as autocomp's hook reports its own.
        """
        profiler = self.profiler

        def hook(state, bucket):  # type: ignore[no-untyped-def]
            layout = self._layout(bucket)
            if (name := self._sparse_name(layout)) is not None:
                self._note_sparse_size(name, bucket.buffer())
            if reports_itself:
                future = inner(state, bucket)  # the step listener runs inside
            else:
                if not self._in_step:
                    self._in_step = True
                    self._step_started()
                entered = profiler.hook_entered(bucket.index())
                future = inner(state, bucket)
                profiler.hook_exited(entered)
                # Opaque: whatever it sends, its future is the bucket's collective.
                profiler.collective(Collective.ALL_REDUCE, layout.nbytes, future)
            step = self.current
            if step is not None:
                step.layouts[bucket.index()] = layout
            first = len(self.steps) == 1
            callbacks.add_done_callback(future, functools.partial(self._sample, layout, first))
            if bucket.is_last():
                self._in_step = False
                if step is not None:
                    step.complete = True
                self.backwards += 1
                self.session.step_completed(self)
            return future

        # DDP checks a hook's annotations against the real classes; with postponed annotations
        # they would be strings and rejected, so the wrapper carries none.
        hook.__annotations__ = {}
        hook.__name__ = f"autocomp_advisor_timed_{getattr(inner, '__name__', 'hook')}"
        return hook

    def _layout(self, bucket: dist.GradBucket) -> BucketLayout:
        params = bucket.parameters()
        key = tuple(id(p) for p in params)
        cached = self._layouts.get(bucket.index())
        if cached is not None and cached.key == key:
            return cached
        buffer = bucket.buffer()
        layout = BucketLayout(
            key=key,
            names=tuple(self.names.get(id(p), f"<unnamed {i}>") for i, p in enumerate(params)),
            shapes=tuple(bucket_shape(p)[0] for p in params),  # complex: the real view
            nbytes=buffer.numel() * buffer.element_size(),
        )
        self._layouts[bucket.index()] = layout
        return layout

    def _sample(self, layout: BucketLayout, first: bool, future: torch.futures.Future) -> None:
        """Averaged gradient norms and one gradient per shape, from the first step.

        A parameter unused in the first step (``find_unused_parameters``, a branch) has a zero
        gradient there that says nothing about its norm or error, so later steps fill in such
        parameters from their first non-zero gradient. Only those: the norms run on the
        completion thread while the backward goes on, and timed steps must not pay for them.
        """
        sparse = self._sparse_name(layout)
        if not first and not self._unseen and sparse is None:
            return
        try:
            value = future.value()
        except Exception:  # the collective failed; the script sees that error itself
            return
        if sparse is not None:
            self._sample_sparse(sparse, value, first)
            return
        try:
            flat = value[0] if isinstance(value, (list, tuple)) else value
            offset = 0
            for name, shape in zip(layout.names, layout.shapes, strict=True):
                numel = shape.numel()
                start, offset = offset, offset + numel
                if not first and name not in self._unseen:
                    continue
                piece = flat[start : start + numel].detach()
                norm = self._record_norm(name, piece)
                self.nonzero_shares[name] = float(nonzero_share(piece))
                key = tuple(shape)
                if not self.session.keep_gradients or not eligible(key, self.session.min_numel):
                    continue
                if key not in self.samples or (key in self._zero_samples and norm > 0):
                    self.samples[key] = piece.reshape(shape).to(torch.float32, copy=True)
                    if norm > 0:
                        self._zero_samples.discard(key)
                    else:
                        self._zero_samples.add(key)
        except Exception:  # never break the user's training because of the profiler
            logger.exception("autocomp-advisor: could not sample the step's gradients")

    def _sparse_name(self, layout: BucketLayout) -> str | None:
        """The parameter of a sparse gradient's bucket (DDP gives each its own), else None."""
        if len(layout.names) == 1 and layout.names[0] in self.sparse:
            return layout.names[0]
        return None

    def _note_sparse_size(self, name: str, grad: torch.Tensor) -> None:
        """What this rank puts into a sparse gradient's collective, every step (the rows a
        step touches vary): before the collective, whose result gathers every rank's."""
        if grad.is_sparse:
            self.sparse_bytes.setdefault(name, []).append(sparse_bytes(grad))

    def _sample_sparse(self, name: str, value: Any, first: bool) -> None:
        """A sparse gradient's norm, from its averaged rows; it is never compressed, so no
        gradient is kept for the compressor costs."""
        try:
            grad = value[0] if isinstance(value, (list, tuple)) else value
            if not grad.is_sparse:
                return
            if first or name in self._unseen:
                self._record_norm(name, grad.coalesce().values())
        except Exception:  # never break the user's training because of the profiler
            logger.exception("autocomp-advisor: could not sample a sparse gradient")

    def _record_norm(self, name: str, values: torch.Tensor) -> float:
        """Keep a parameter's first non-zero gradient norm; a zero one (unused in that step)
        marks it to be sampled again."""
        norm = float(torch.linalg.vector_norm(values, dtype=torch.float64))
        if norm > 0 or name not in self.grad_norms:
            self.grad_norms[name] = norm
            l1 = float(torch.linalg.vector_norm(values, 1, dtype=torch.float64))
            if math.isfinite(l1):
                self.grad_l1s[name] = l1
            else:  # weighed by the L2 estimate, as the policy weighs a profile without one
                self.grad_l1s.pop(name, None)
        if norm > 0:
            self._unseen.discard(name)
        else:
            self._unseen.add(name)
        return norm

    def release(self) -> None:
        """Drop the references to the DDP model (and so its reducer); the records stay."""
        if self.hook_state is not None:
            self.hook_state.profiler = None
            self.hook_state.step_listener = None
            self.hook_state = None
        self.ddp = None
        self.current = None

    # ---- summary -----------------------------------------------------------------------------

    def completed_steps(self) -> list[_StepMetrics]:
        out = [_metrics(s) for s in self.steps]
        return [m for m in out if m is not None]

    def used_steps(self) -> list[_StepMetrics]:
        """Completed steps the timings use: all but the first (DDP's bucket rebuild) if more."""
        metrics = self.completed_steps()
        return metrics[1:] if len(metrics) >= 2 else metrics

    def local_step_seconds(self) -> float:
        """This rank's ``step_s``, over the same steps as :meth:`profile` uses."""
        timed = _timed(self.used_steps())
        return statistics.median(m.step_s for m in timed) if timed else 0.0

    def profile(self, rank_step_s: tuple[float, ...] = ()) -> tuple[ModelProfile | None, list[str]]:
        """This model's part of the profile (None without a completed step), plus notes."""
        notes: list[str] = []
        complete = [(s, m) for s in self.steps if (m := _metrics(s)) is not None]
        if not complete:
            return None, notes
        used = complete[1:] if len(complete) >= 2 else complete
        if len(complete) < 2:
            notes.append(
                f"model {self.index}: only the first step was captured; its timings include "
                "DDP's first-iteration work (bucket rebuild) and are pessimistic"
            )
        metrics = [m for _, m in used]
        timed = _timed(metrics)
        whole = sum(m.whole for m in metrics)
        if whole < 2:
            which = (
                "no profiled step was followed by another, so they exclude the optimizer step"
                if whole == 0
                else "only 1 profiled step was followed by another, so they rest on that step"
            )
            notes.append(
                f"model {self.index}: UNRELIABLE step time: step_s and compute_step_s are "
                f"not medians: {which}; profile at least 4 steps"
            )
        forward = statistics.median(m.forward_s for m in metrics)
        backward = statistics.median(m.backward_s for m in metrics)
        first = statistics.median(m.first_ready_s for m in metrics)
        step_s = statistics.median(m.step_s for m in timed)
        # Per step, then the median: medians of step, E and hook taken separately can come
        # from different steps (one slow, skewed last step) and subtract to nothing.
        compute = statistics.median(m.step_s - m.exposed_s - m.hook_s for m in timed)
        compute = max(forward + backward, min(compute, step_s))
        timing = Timing(
            steps_used=len(metrics),
            forward_s=forward,
            backward_s=backward,
            first_bucket_ready_s=first,
            last_bucket_ready_s=backward,
            hideable_s=max(0.0, backward - first),
            step_s=step_s,
            exposed_comm_s=statistics.median(m.exposed_s for m in timed),
            hook_s=statistics.median(m.hook_s for m in timed),
            compute_step_s=compute,
            rank_step_s=rank_step_s,
        )
        bucket_ready: dict[int, list[float]] = {}
        for m in metrics:
            for index, ready in m.ready.items():
                bucket_ready.setdefault(index, []).append(ready)
        layouts = used[-1][0].layouts
        buckets = sorted(
            (
                BucketInfo(
                    index=index,
                    params=layout.names,
                    bytes=layout.nbytes,
                    ready_s=statistics.median(bucket_ready.get(index, [0.0])),
                )
                for index, layout in layouts.items()
            ),
            key=lambda b: (b.ready_s, b.index),
        )
        bucket_of = {name: b.index for b in buckets for name in b.params}
        layers = tuple(
            LayerInfo(
                name=name,
                shape=tuple(shape),
                dtype=str(dtype).removeprefix("torch."),
                bucket=bucket_of.get(name),
                grad_norm=self.grad_norms.get(name, 0.0),
                grad_l1=self.grad_l1s.get(name),
                nonzero_share=self.nonzero_shares.get(name, 1.0),
                sparse_bytes=(
                    round(statistics.median(self.sparse_bytes[name]))
                    if self.sparse_bytes.get(name)
                    else (0 if name in self.sparse else None)
                ),
            )
            for name, p in self.params
            for shape, dtype in [bucket_shape(p)]
        )
        missing = [layer.name for layer in layers if layer.bucket is None]
        if missing:
            notes.append(f"model {self.index}: parameters never seen in a bucket: {missing[:5]}")
        model = ModelProfile(
            index=self.index,
            module_class=self.module_class,
            layers=layers,
            buckets=tuple(buckets),
            timing=timing,
        )
        if self.hook_note:
            notes.append(f"model {self.index}: {self.hook_note}")
        return model, notes
