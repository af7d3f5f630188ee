"""Finding the DDP models an unmodified training script builds, and timing their steps.

``autocomp-advisor profile train.py`` must work on the script people already have, so nothing
in the script changes. Instead, while the script runs (via :mod:`runpy`, in this process):

* ``DistributedDataParallel.__init__`` is wrapped: after DDP's own constructor, the model is
  recorded with its parameter names, and forward pre/post hooks on it mark step boundaries
  and forward time;
* before the model's first forward a comm hook is registered that does what DDP's default
  does (average the bucket with one all-reduce) and notes when each bucket became ready, how
  long the hook ran and when its collective completed. If the script registers a comm hook of
  its own (``autocomp.wrap`` does), ``register_comm_hook`` is wrapped so that its hook is
  timed the same way instead, and it keeps working;
* ``torch.distributed.destroy_process_group()`` is deferred until the profiler is done, since
  the link is measured with the script's process group after its steps.

Each model counts its completed backwards (the last bucket handed to the hook). A script's
optimizer iterations are the backwards of the model that completed the fewest: a GAN's
discriminator syncs twice per iteration (its own loss and the generator's), the generator once.
Once every model that completed a backward reached ``--steps``, the next training forward raises
:class:`_StopScript` (a ``BaseException``, so a script's ``except Exception`` does not swallow
it); the runner catches it, measures the link between the ranks
(:mod:`autocomp.advisor.linkprobe`) and, on rank 0, the compressors on the captured gradients
(:mod:`autocomp.advisor.costs`), and writes the profile (:mod:`autocomp.advisor.profile`). A
script that catches the stop anyway (a bare ``except:``) and then exits or raises still counts
as stopped: its steps were all captured.

Launching: under ``torchrun ... -m autocomp.advisor profile`` (``RANK`` in the environment)
each process profiles itself. Otherwise the advisor plays torchrun: it starts ``--nproc``
local processes with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1`` and
a free ``MASTER_PORT`` set, over loopback (gloo).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import gc
import json
import logging
import os
import platform
import runpy
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from autocomp.advisor.costs import CostMeter, eligible
from autocomp.advisor.linkprobe import measure_link
from autocomp.advisor.profile import (
    BucketInfo,
    LayerInfo,
    LinkMeasurement,
    ModelProfile,
    Profile,
    ScriptInfo,
    Timing,
)

logger = logging.getLogger(__name__)

__all__ = ["NO_DDP_MESSAGE", "CaptureSession", "ModelCapture", "ProfileRunner"]

ENV_SPAWNED = "AUTOCOMP_ADVISOR_SPAWNED"
"""Set in the processes the advisor starts itself (not under the user's torchrun)."""
ENV_RUNDIR = "AUTOCOMP_ADVISOR_RUNDIR"
"""Directory where spawned ranks other than 0 leave their tracebacks for the parent."""

NO_DDP_MESSAGE = """\
the script built no torch.nn.parallel.DistributedDataParallel model, so there is nothing to
profile. Wrap the model in DDP once torch.distributed is initialized, for example:

    dist.init_process_group("gloo")          # "nccl" on GPUs; the advisor sets the env
    model = torch.nn.parallel.DistributedDataParallel(model)
    loss = model(batch).mean(); loss.backward(); optimizer.step()
"""

now = time.perf_counter


class _StopScript(BaseException):
    """Raised at a training forward once enough steps were captured; caught by the runner.

    Its message explains itself, since a script with a bare ``except:`` may print it.
    """


# ---- one model's timeline --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Layout:
    """A bucket's parameters as DDP hands them to the comm hook."""

    key: tuple[int, ...]
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    nbytes: int


@dataclass(slots=True)
class _HookCall:
    bucket: int
    entered: float
    exited: float
    layout: _Layout


@dataclass(slots=True)
class _StepRecord:
    """One iteration of one model: forward start to the next training forward."""

    started: float
    forward_s: float = 0.0
    forward_end: float | None = None
    calls: list[_HookCall] = field(default_factory=list)
    done: list[float] = field(default_factory=list)
    complete: bool = False
    """The last bucket of the backward was handed to the hook."""
    next_start: float | None = None


@dataclass(frozen=True, slots=True)
class _StepMetrics:
    forward_s: float
    backward_s: float
    first_ready_s: float
    hideable_s: float
    step_s: float
    exposed_s: float
    hook_s: float
    ready: dict[int, float]
    has_next: bool


def _metrics(step: _StepRecord) -> _StepMetrics | None:
    """Timeline quantities of ``docs/policy.md`` for one completed step, hook time removed."""
    if not step.complete or not step.calls or step.forward_end is None:
        return None
    calls = sorted(step.calls, key=lambda c: c.entered)
    hook_before = 0.0
    ready: dict[int, float] = {}
    for call in calls:
        ready[call.bucket] = max(0.0, call.entered - step.forward_end - hook_before)
        hook_before += call.exited - call.entered
    last_exit = max(c.exited for c in calls)
    comm_done = max(step.done) if len(step.done) >= len(calls) else None
    exposed = max(0.0, comm_done - last_exit) if comm_done is not None else 0.0
    if step.next_start is not None:
        step_s = step.next_start - step.started
    else:
        step_s = max(last_exit, comm_done or last_exit) - step.started
    backward = ready[calls[-1].bucket]
    first = min(ready.values())
    return _StepMetrics(
        forward_s=step.forward_s,
        backward_s=backward,
        first_ready_s=first,
        hideable_s=max(0.0, backward - first),
        step_s=step_s,
        exposed_s=exposed,
        hook_s=hook_before,
        ready=ready,
        has_next=step.next_start is not None,
    )


def _allreduce_hook(
    process_group: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """What DDP does without a hook: average the bucket with one all-reduce."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size(group))
    future = dist.all_reduce(buffer, group=group, async_op=True).get_future()
    return future.then(lambda f: f.value()[0])


class ModelCapture:
    """Timeline, bucket layout and first-step gradients of one DDP model."""

    def __init__(self, ddp: DistributedDataParallel, index: int, session: CaptureSession) -> None:
        self.ddp: DistributedDataParallel | None = ddp
        self.index = index
        self.session = session
        self.module_class = type(ddp.module).__name__
        self.params = [(n, p) for n, p in ddp.module.named_parameters() if p.requires_grad]
        self.names = {id(p): n for n, p in self.params}
        self.hook_installed = False
        self.hook_timed = False
        """A timed comm hook is registered, so this model's backwards are seen and counted."""
        self.hook_note: str | None = None
        self.steps: list[_StepRecord] = []
        self.current: _StepRecord | None = None
        self.backwards = 0
        """Completed backwards (last bucket handed to the hook): this model's steps."""
        self.grad_norms: dict[str, float] = {}
        """Norm of each parameter's averaged gradient in the first step where it is not zero."""
        self._unseen: set[str] = set()
        self.samples: dict[tuple[int, ...], torch.Tensor] = {}
        """One real averaged gradient per eligible shape (rank 0), for the compressor costs;
        a zero one (a parameter unused in that step) is replaced by the next non-zero one."""
        self._zero_samples: set[tuple[int, ...]] = set()
        self._forward_started = 0.0
        ddp.register_forward_pre_hook(self._pre_forward)
        ddp.register_forward_hook(self._post_forward)

    # ---- step boundaries ---------------------------------------------------------------------

    def close_step(self, t: float) -> None:
        step = self.current
        if step is not None and step.complete and step.next_start is None:
            step.next_start = t

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        if not torch.is_grad_enabled():
            return  # evaluation: no gradient sync, not a step boundary
        t = now()
        self.close_step(t)
        self.session.maybe_stop(t)
        if not self.hook_installed:
            self.session.install_default_hook(self)
        if self.current is None or self.current.complete:
            self.current = _StepRecord(started=t)
            self.steps.append(self.current)
        self._forward_started = t

    def _post_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        step = self.current
        if step is not None and torch.is_grad_enabled() and not step.complete:
            t = now()
            step.forward_s += t - self._forward_started
            step.forward_end = t

    # ---- the comm hook -----------------------------------------------------------------------

    def timed(self, inner: Callable[[Any, dist.GradBucket], torch.futures.Future]) -> Callable:
        """``inner`` wrapped so that every call is timed; its behaviour is unchanged."""
        layouts: dict[int, _Layout] = {}

        def hook(state, bucket):  # type: ignore[no-untyped-def]
            entered = now()
            step = self.current
            if step is None or step.complete:  # a backward without a forward through DDP
                step = self.current = _StepRecord(started=entered, forward_end=entered)
                self.steps.append(step)
            layout = self._layout(bucket, layouts)
            future = inner(state, bucket)
            exited = now()
            step.calls.append(_HookCall(bucket.index(), entered, exited, layout))
            future.add_done_callback(functools.partial(_mark_done, step))
            future.add_done_callback(functools.partial(self._sample, layout))
            if bucket.is_last():
                step.complete = True
                self.backwards += 1
                self.session.step_completed(self)
            return future

        # DDP checks a hook's annotations against the real classes; with postponed annotations
        # they would be strings and rejected, so the wrapper carries none.
        hook.__annotations__ = {}
        hook.__name__ = f"autocomp_advisor_timed_{getattr(inner, '__name__', 'hook')}"
        return hook

    def _layout(self, bucket: dist.GradBucket, cache: dict[int, _Layout]) -> _Layout:
        params = bucket.parameters()
        key = tuple(id(p) for p in params)
        cached = cache.get(bucket.index())
        if cached is not None and cached.key == key:
            return cached
        buffer = bucket.buffer()
        layout = _Layout(
            key=key,
            names=tuple(self.names.get(id(p), f"<unnamed {i}>") for i, p in enumerate(params)),
            shapes=tuple(p.shape for p in params),
            nbytes=buffer.numel() * buffer.element_size(),
        )
        cache[bucket.index()] = layout
        return layout

    def _sample(self, layout: _Layout, future: torch.futures.Future) -> None:
        """Averaged gradient norms and one gradient per shape, from the first step.

        A parameter unused in the first step (``find_unused_parameters``, a branch) has a zero
        gradient there that says nothing about its norm or error, so later steps fill in such
        parameters from their first non-zero gradient. Only those: the norms run on the
        completion thread while the backward goes on, and timed steps must not pay for them.
        """
        first = len(self.steps) == 1
        if not first and not self._unseen:
            return
        try:
            value = future.value()
        except Exception:  # the collective failed; the script sees that error itself
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
                norm = float(torch.linalg.vector_norm(piece, dtype=torch.float64))
                if norm > 0 or name not in self.grad_norms:
                    self.grad_norms[name] = norm
                if norm > 0:
                    self._unseen.discard(name)
                else:
                    self._unseen.add(name)
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

    # ---- summary -----------------------------------------------------------------------------

    def completed_steps(self) -> list[_StepMetrics]:
        out = [_metrics(s) for s in self.steps]
        return [m for m in out if m is not None]

    def release(self) -> None:
        """Drop the reference to the DDP model (and so its reducer); the records stay."""
        self.ddp = None
        self.current = None

    def used_steps(self) -> list[_StepMetrics]:
        """Completed steps the timings use: all but the first (DDP's bucket rebuild) if more."""
        metrics = self.completed_steps()
        return metrics[1:] if len(metrics) >= 2 else metrics

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
        with_next = sum(m.has_next for m in metrics)
        if with_next < 2:
            which = (
                "no profiled step had a following forward, so they exclude the optimizer step"
                if with_next == 0
                else "only 1 profiled step had a following forward, so they rest on that step"
            )
            notes.append(
                f"model {self.index}: UNRELIABLE step time: step_s and compute_step_s are "
                f"not medians: {which}; profile at least 3 steps"
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
        last_step = used[-1][0]
        bucket_ready: dict[int, list[float]] = {}
        for m in metrics:
            for index, ready in m.ready.items():
                bucket_ready.setdefault(index, []).append(ready)
        layouts = {call.bucket: call.layout for call in last_step.calls}
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
        grad_norms = self.grad_norms
        layers = tuple(
            LayerInfo(
                name=name,
                shape=tuple(p.shape),
                dtype=str(p.dtype).removeprefix("torch."),
                bucket=bucket_of.get(name),
                grad_norm=grad_norms.get(name, 0.0),
            )
            for name, p in self.params
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

    def local_step_seconds(self) -> float:
        """This rank's ``step_s``, over the same steps as :meth:`profile` uses."""
        timed = _timed(self.used_steps())
        return statistics.median(m.step_s for m in timed) if timed else 0.0


def _timed(metrics: list[_StepMetrics]) -> list[_StepMetrics]:
    """The steps that time a whole iteration: those a forward followed (else all of them).

    A step without a following forward ends at its last collective, without the optimizer
    step; mixing both kinds would compare different intervals.
    """
    return [m for m in metrics if m.has_next] or metrics


def _mark_done(step: _StepRecord, _: torch.futures.Future) -> None:
    step.done.append(now())


# ---- the session: patches, step counting, progress -------------------------------------------


class _Progress:
    """A rich progress bar on stderr (rank 0); silent where stderr is not a terminal."""

    def __init__(self, enabled: bool, total: int, label: str) -> None:
        self._bar: Any = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = Console(stderr=True)
        if not console.is_terminal:
            return
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            console=console,
            redirect_stdout=sys.stdout.isatty(),
            redirect_stderr=False,
            transient=False,
        )
        self._task = self._bar.add_task(label, total=total, note="")
        self._bar.start()

    def update(self, completed: int, note: str = "") -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=completed, note=note)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


class CaptureSession:
    """Patches torch while a script runs, tracks its DDP models and stops it after N steps."""

    def __init__(self, *, steps: int, rank: int, min_numel: int, progress: bool) -> None:
        self.target = steps
        self.rank = rank
        self.min_numel = min_numel
        self.keep_gradients = rank == 0
        self.models: list[ModelCapture] = []
        self.stop_raised = False
        """:class:`_StopScript` was raised: whatever the script does afterwards, it was stopped."""
        self.destroy_requested = False
        self.backend: str | None = None
        """torch.distributed backend the script used (read before the group is destroyed)."""
        self.progress = _Progress(progress, steps, "profiling")
        self._register: Callable[..., Any] | None = None
        self._destroy: Callable[..., Any] | None = None

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        """Wrap DDP's constructor and register_comm_hook, defer destroy_process_group."""
        cls = DistributedDataParallel
        original_init = cls.__init__
        original_register = cls.register_comm_hook
        original_builtin = cls._register_builtin_comm_hook
        original_destroy = dist.destroy_process_group
        self._register, self._destroy = original_register, original_destroy
        session = self

        @functools.wraps(original_init)
        def init(ddp: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
            original_init(ddp, *args, **kwargs)
            try:
                session.models.append(ModelCapture(ddp, len(session.models), session))
            except Exception:
                logger.exception("autocomp-advisor: could not track a DDP model")

        @functools.wraps(original_register)
        def register(ddp: DistributedDataParallel, state: object, hook: Callable) -> None:
            capture = session.capture_of(ddp)
            if capture is None or capture.hook_installed:
                return original_register(ddp, state, hook)
            capture.hook_installed = True
            capture.hook_note = f"timed the script's own comm hook {getattr(hook, '__name__', '')}"
            result = original_register(ddp, state, capture.timed(hook))
            capture.hook_timed = True
            return result

        @functools.wraps(original_builtin)
        def register_builtin(ddp: DistributedDataParallel, comm_hook_type: Any) -> None:
            capture = session.capture_of(ddp)
            if capture is not None and not capture.hook_installed:
                # A C++ hook: nothing of it can be wrapped, so its buckets cannot be timed.
                capture.hook_installed = True
                name = getattr(comm_hook_type, "name", str(comm_hook_type))
                capture.hook_note = (
                    f"its comm hook cannot be timed: the script registered DDP's built-in "
                    f"(C++) comm hook {name}; register the Python equivalent from "
                    "torch.distributed.algorithms.ddp_comm_hooks with register_comm_hook "
                    "instead, or profile without it"
                )
            return original_builtin(ddp, comm_hook_type)

        @functools.wraps(original_destroy)
        def destroy(group: dist.ProcessGroup | None = None) -> None:
            if group is None:
                session.destroy_requested = True  # after the link measurement
                return None
            return original_destroy(group)

        cls.__init__ = init  # type: ignore[method-assign]
        cls.register_comm_hook = register  # type: ignore[method-assign]
        cls._register_builtin_comm_hook = register_builtin  # type: ignore[method-assign]
        dist.destroy_process_group = destroy
        try:
            yield
        finally:
            cls.__init__ = original_init  # type: ignore[method-assign]
            cls.register_comm_hook = original_register  # type: ignore[method-assign]
            cls._register_builtin_comm_hook = original_builtin  # type: ignore[method-assign]
            dist.destroy_process_group = original_destroy

    def capture_of(self, ddp: DistributedDataParallel) -> ModelCapture | None:
        return next((m for m in self.models if m.ddp is ddp), None)

    def install_default_hook(self, capture: ModelCapture) -> None:
        capture.hook_installed = True
        assert self._register is not None
        try:
            ddp = capture.ddp
            assert ddp is not None  # released only after the script
            self._register(ddp, ddp.process_group, capture.timed(_allreduce_hook))
            capture.hook_timed = True
        except Exception as err:  # e.g. a hook registered behind the advisor's back
            capture.hook_note = f"its comm hook cannot be timed: {err}"
            logger.debug("autocomp-advisor: model %d: %s", capture.index, capture.hook_note)

    @property
    def steps_done(self) -> int:
        """Optimizer iterations captured: backwards of the model that completed the fewest.

        Models that never completed a backward (evaluation only, frozen, untimed) do not
        count; a model that syncs several times per iteration (a GAN's discriminator, which
        also gets gradients from the generator's loss) does not inflate the count.
        """
        counts = [m.backwards for m in self.models if m.backwards]
        return min(counts) if counts else 0

    def step_completed(self, capture: ModelCapture) -> None:
        self.progress.update(self.steps_done)

    def maybe_stop(self, t: float) -> None:
        if self.stop_raised or self.steps_done >= self.target:
            for capture in self.models:
                capture.close_step(t)
            self.stop_raised = True
            raise _StopScript(
                f"autocomp-advisor: {self.steps_done} steps captured, stopping the script "
                "(this is not an error)"
            )

    def destroy_process_group(self) -> None:
        """The real destroy, if a process group is still up; then the DDP models are let go.

        Their reducers hold the process group and the comm hooks (Python callables). Left
        for interpreter shutdown, gloo's threads may touch Python objects while it is torn
        down and abort the process ("terminate called without an active exception").
        """
        destroy = self._destroy or dist.destroy_process_group
        if dist.is_available() and dist.is_initialized():
            destroy()
        for capture in self.models:
            capture.release()
        gc.collect()


# ---- running one rank ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Outcome:
    kind: str
    """'stopped' (enough steps), 'finished' (the script ended), 'error' (it raised)."""
    detail: str = ""
    """What went wrong, in full (the partial profile's status)."""
    reason: str = ""
    """What went wrong, short, for one line on the terminal."""
    note: str = ""
    """Something the profile's reader should know about how the script ended."""


def _script_traceback(err: BaseException, script: Path) -> str:
    """The exception's traceback from the script's first frame on (the runner's hidden)."""
    target = os.path.realpath(script)
    tb = err.__traceback__
    cursor = tb
    while cursor is not None and os.path.realpath(cursor.tb_frame.f_code.co_filename) != target:
        cursor = cursor.tb_next
    if cursor is None and isinstance(err, SyntaxError):
        # The script did not compile: no frame of it ran, and the runner's frames (runpy)
        # are noise. The exception itself names the file, line and caret, as Python shows it.
        return "".join(traceback.format_exception_only(type(err), err))
    return "".join(traceback.format_exception(type(err), err, cursor or tb))


def _exit_outcome(code: object) -> tuple[str, str, str]:
    """(detail, reason, text to print) for ``sys.exit(code)`` with a failing code.

    As Python does: an integer is the exit status, anything else is printed to stderr and
    the status is 1.
    """
    if isinstance(code, int):
        reason = f"the script exited with status {code}"
        return reason, reason, ""
    reason = "the script exited with status 1"
    return f"{reason}: {code}", reason, f"{code}\n"


_PEER_LOST_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote worker crash",
    "socket closed",
    "connection refused",
    "timed out",
)
"""Error texts of a collective whose peer died or stopped answering (gloo, NCCL, store)."""


def _peer_lost(err: BaseException) -> bool:
    """Whether ``err`` is a collective or connection error: likely a consequence elsewhere."""
    kinds = tuple(
        getattr(dist, name)
        for name in ("DistBackendError", "DistNetworkError")
        if hasattr(dist, name)
    )
    seen: BaseException | None = err
    for _ in range(5):  # the error and what it was raised from
        if seen is None:
            break
        if isinstance(seen, kinds) or any(m in str(seen).lower() for m in _PEER_LOST_MARKERS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _after_stop(what: str) -> _Outcome:
    """The script caught the advisor's stop (a bare ``except:``) and then ``what``."""
    note = (
        f"the script caught the advisor's stop (a bare 'except:'?) and then {what}; "
        "all steps were captured, so this counts as stopped"
    )
    logger.debug("autocomp-advisor: %s", note)
    return _Outcome("stopped", note=note)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _say(message: str) -> None:
    print(f"autocomp-advisor: {message}", file=sys.stderr, flush=True)


class ProfileRunner:
    """``autocomp-advisor profile``: one rank in place, or N spawned local ranks."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """What to profile and how long to spend on it."""

        script: Path
        """The user's training script, run unmodified."""
        script_args: tuple[str, ...] = ()
        """Its command-line arguments (what followed ``--``)."""
        steps: int = 20
        """Optimizer steps to capture before the script is stopped."""
        nproc: int = 2
        """Local ranks to spawn when not launched by torchrun."""
        out: Path = Path("profile.json")
        """Where rank 0 writes the profile."""
        compressor_budget_s: float = 20.0
        """Wall-clock budget for timing compressors on rank 0."""
        link_budget_s: float = 5.0
        """Wall-clock budget for the all-reduce link probe."""
        timeout_s: float = 1800.0
        """Spawned ranks still running after this long are killed."""
        min_numel: int = 16384
        """Layers smaller than this (or 1-D) are never compressed, so not timed."""

        def __post_init__(self) -> None:
            if self.steps < 1 or self.nproc < 1:
                raise ValueError("steps and nproc must be >= 1")
            if self.compressor_budget_s < 0 or self.link_budget_s < 0 or self.timeout_s <= 0:
                raise ValueError("budgets must be >= 0 and the timeout > 0")

    def __init__(self, config: Config) -> None:
        self.config = config

    # ---- spawn mode --------------------------------------------------------------------------

    def spawn(self) -> int:
        """Start ``nproc`` ranks of this command with torchrun's environment, on loopback."""
        cfg = self.config
        port = _free_port()
        with tempfile.TemporaryDirectory(prefix="autocomp-advisor-") as rundir:
            procs = []
            for rank in range(cfg.nproc):
                env = dict(os.environ)
                env.update(
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE=str(cfg.nproc),
                    LOCAL_WORLD_SIZE=str(cfg.nproc),
                    GROUP_RANK="0",
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                    TORCHELASTIC_RUN_ID="autocomp-advisor",
                )
                env[ENV_SPAWNED] = "1"
                env[ENV_RUNDIR] = rundir
                if cfg.nproc > 1:
                    env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does
                if sys.platform.startswith("linux"):
                    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
                procs.append(subprocess.Popen(self._child_command(), env=env))
            codes = _wait_all(procs, cfg.timeout_s)
            if codes is None:
                _say(f"profiling timed out after {cfg.timeout_s:g} s; the ranks were stopped")
                _show_failures(Path(rundir), [1] * cfg.nproc)
                return 1
            _show_failures(Path(rundir), codes)
            failing = [c for c in codes if c]
            return codes[0] or (failing[0] if failing else 0)

    def _child_command(self) -> list[str]:
        cfg = self.config
        command = [
            sys.executable,
            "-m",
            "autocomp.advisor",
            "profile",
            str(cfg.script),
            "--steps",
            str(cfg.steps),
            "--out",
            str(cfg.out.resolve()),
            "--compressor-budget",
            str(cfg.compressor_budget_s),
            "--link-budget",
            str(cfg.link_budget_s),
        ]
        return [*command, "--", *cfg.script_args]

    # ---- rank mode ---------------------------------------------------------------------------

    def run_rank(self) -> int:
        """Profile the script in this process, one rank of a launched job."""
        cfg = self.config
        rank = int(os.environ.get("RANK", "0"))
        session = CaptureSession(
            steps=cfg.steps, rank=rank, min_numel=cfg.min_numel, progress=rank == 0
        )
        started = time.time()
        try:
            outcome = self._run_script(session, rank)
        finally:
            session.progress.stop()
        if not session.models:
            if outcome.kind != "error":
                session.destroy_process_group()
            if rank == 0 and outcome.kind == "error":
                _say(f"{outcome.reason} before it built a DDP model; no profile was written")
            elif rank == 0:
                _say(NO_DDP_MESSAGE)
            return 1
        steps = session.steps_done
        if steps == 0:
            if outcome.kind != "error":
                # Before returning: a gloo group left up at exit aborts the process
                # ("terminate called without an active exception").
                session.destroy_process_group()
            untimed = [m for m in session.models if not m.hook_timed and m.hook_note]
            if rank == 0 and untimed:
                for capture in untimed:
                    _say(
                        f"no step was captured: model {capture.index} ({capture.module_class}): "
                        f"{capture.hook_note}"
                    )
            elif rank == 0 and outcome.kind != "error":
                _say(
                    "the script built a DDP model but no backward went through it, so no step "
                    "was captured; does it train (loss.backward()) with gradients enabled?"
                )
            elif rank == 0:
                _say(f"{outcome.reason} before a step was captured; no profile was written")
            return 1

        link: LinkMeasurement | None = None
        rank_steps: list[tuple[float, ...]] = [() for _ in session.models]
        notes: list[str] = []
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if outcome.kind != "error" and world > 1:
            try:
                local = [m.local_step_seconds() for m in session.models]
                gathered: list[Any] = [None] * world
                dist.all_gather_object(gathered, local)
                rank_steps = [
                    tuple(float(g[i]) for g in gathered) for i in range(len(session.models))
                ]
                if rank == 0:
                    _say(f"captured {steps} steps; measuring the link between {world} ranks")
                link = measure_link(device=_device_of(session), budget_s=cfg.link_budget_s)
            except Exception as err:
                notes.append(f"link not measured: {type(err).__name__}: {err}")
                logger.warning("autocomp-advisor: link measurement failed: %s", err)
        if dist.is_available() and dist.is_initialized():
            with contextlib.suppress(Exception):
                session.backend = str(dist.get_backend())
        if outcome.kind != "error":
            session.destroy_process_group()
        if rank != 0:
            return 1 if outcome.kind == "error" else 0
        return self._write(session, outcome, link, rank_steps, notes, world, started)

    def _run_script(self, session: CaptureSession, rank: int) -> _Outcome:
        cfg = self.config
        script = str(cfg.script)
        saved_argv, saved_path = sys.argv, list(sys.path)
        sys.argv = [script, *cfg.script_args]
        sys.path.insert(0, str(cfg.script.resolve().parent))
        try:
            with session.patched():
                runpy.run_path(script, run_name="__main__")
            outcome = _Outcome("finished")
        except _StopScript:
            return _Outcome("stopped")
        except SystemExit as exit_:
            code = exit_.code
            if session.stop_raised:
                outcome = _after_stop("exited" if code in (None, 0) else f"exited with {code!r}")
            elif code in (None, 0):
                outcome = _Outcome("finished")
            else:
                detail, reason, text = _exit_outcome(code)
                outcome = self._failed(detail, reason, rank, text, peer_lost=False)
        except Exception as err:
            if session.stop_raised:
                outcome = _after_stop(f"raised {type(err).__name__}: {err}")
            else:
                text = _script_traceback(err, cfg.script)
                reason = f"the script raised {type(err).__name__}"
                outcome = self._failed(
                    f"{reason}: {err}", reason, rank, text, peer_lost=_peer_lost(err)
                )
        finally:
            sys.argv = saved_argv
            sys.path[:] = saved_path
        if outcome.kind == "finished" and session.stop_raised:
            return _after_stop("went on to its end")
        return outcome

    def _failed(
        self, detail: str, reason: str, rank: int, text: str, *, peer_lost: bool
    ) -> _Outcome:
        """Show (rank 0) or hand to the spawning parent (other ranks) what went wrong."""
        rundir = os.environ.get(ENV_RUNDIR)
        spawned = bool(os.environ.get(ENV_SPAWNED) and rundir)
        if spawned:
            # The parent decides which of the other ranks' errors to show, and labels them;
            # rank 0's is shown here, as it happens, and only its kind is needed there.
            report = {"text": text or detail + "\n", "peer_lost": peer_lost}
            Path(str(rundir), f"rank{rank}.failure.json").write_text(json.dumps(report))
        if text and (rank == 0 or not spawned):
            if rank != 0:
                print(f"--- rank {rank} ---", file=sys.stderr)
            print(text, file=sys.stderr, end="", flush=True)
        return _Outcome("error", detail, reason)

    def _write(
        self,
        session: CaptureSession,
        outcome: _Outcome,
        link: LinkMeasurement | None,
        rank_steps: list[tuple[float, ...]],
        notes: list[str],
        world: int,
        started: float,
    ) -> int:
        cfg = self.config
        models = []
        for capture, ranks in zip(session.models, rank_steps, strict=True):
            model, model_notes = capture.profile(ranks)
            notes.extend(model_notes)
            if model is not None:
                models.append(model)
            else:
                why = f": {capture.hook_note}" if capture.hook_note else ""
                notes.append(
                    f"model {capture.index} ({capture.module_class}) never completed a step{why}"
                )
        if outcome.note:
            notes.append(outcome.note)
        grads: dict[tuple[int, ...], torch.Tensor] = {}
        for capture in session.models:
            for shape, grad in capture.samples.items():
                grads.setdefault(shape, grad)
        meter = CostMeter(CostMeter.Config(budget_s=cfg.compressor_budget_s))
        if grads and cfg.compressor_budget_s > 0:
            _say(
                f"timing {len(meter.config.specs)} compressors on {len(grads)} layer shapes "
                f"(budget {cfg.compressor_budget_s:g} s)"
            )
        measured = meter.measure(grads) if cfg.compressor_budget_s > 0 else []
        if session.steps_done < cfg.steps and outcome.kind == "finished":
            notes.append(
                f"the script finished after {session.steps_done} of the {cfg.steps} steps asked"
            )
        complete = outcome.kind != "error"
        status = {
            "stopped": f"stopped after {session.steps_done} steps",
            "finished": f"the script finished after {session.steps_done} steps",
        }.get(outcome.kind, f"partial: {outcome.detail}")
        profile = Profile(
            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            complete=complete,
            status=status,
            notes=tuple(notes),
            script=ScriptInfo(
                path=str(cfg.script),
                args=cfg.script_args,
                steps_requested=cfg.steps,
                steps_captured=session.steps_done,
            ),
            environment=_environment(session, world, time.time() - started),
            world_size=world,
            models=tuple(models),
            link=link,
            compressors=tuple(measured),
            compressor_budget_s=cfg.compressor_budget_s,
            compressor_threads=torch.get_num_threads(),
            skipped=tuple(meter.skipped),
        )
        if not models:
            _say("no model completed a step, so no profile was written")
            return 1
        profile.save(cfg.out)
        if not complete:
            _say(
                f"{outcome.reason}; kept the partial profile of the {session.steps_done} step(s) "
                f"captured before that in {cfg.out}"
            )
            return 1
        link_text = (
            "link not measured (one rank)"
            if link is None
            else f"link {link.bandwidth_bytes_per_s * 8 / 1e9:.3g} Gbit/s, "
            f"{link.latency_s * 1e6:.0f} us/hop"
        )
        model = profile.model()
        _say(
            f"wrote {cfg.out}: {session.steps_done} steps, {len(model.layers)} layers in "
            f"{len(model.buckets)} buckets, step {model.timing.step_s * 1e3:.1f} ms, {link_text}"
        )
        for note in notes:
            _say(f"note: {note}")
        return 0


def _device_of(session: CaptureSession) -> torch.device:
    for capture in session.models:
        for _, param in capture.params:
            return param.device
    return torch.device("cpu")


def _environment(session: CaptureSession, world: int, seconds: float) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "backend": session.backend,
        "device": str(_device_of(session)),
        "launcher": "autocomp-advisor (spawn)" if os.environ.get(ENV_SPAWNED) else "external",
        "world_size": world,
        "profile_seconds": round(seconds, 3),
        "argv": json.dumps(sys.argv),
    }


def _read_failure(rundir: Path, rank: int) -> dict[str, Any] | None:
    try:
        report = json.loads((rundir / f"rank{rank}.failure.json").read_text())
    except (OSError, ValueError):
        return None  # killed (or stopped after the grace period) before it could report
    return report if isinstance(report, dict) else None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _show_failures(rundir: Path, codes: list[int]) -> None:
    """Print the errors of the failing ranks other than 0 (rank 0 printed its own).

    When a rank dies, its peers fail in their next collective ("Connection closed by peer"),
    rank 0 included, so rank 0's own traceback is often only the consequence: then the other
    ranks' errors are the likely root cause and are labelled so. Errors that are themselves
    a lost peer are left out when another rank has a real one, and a message already shown
    (rank 0's, or an earlier rank's) is not repeated.
    """
    failures = {
        rank: report
        for rank in range(1, len(codes))
        if codes[rank] and (report := _read_failure(rundir, rank)) is not None
    }
    if not failures:
        return
    rank0 = _read_failure(rundir, 0) if codes[0] else None
    real = {r: f for r, f in failures.items() if not f.get("peer_lost")}
    label = ""
    if codes[0] and (rank0 is None or rank0.get("peer_lost")):
        # Rank 0 lost a peer, or was stopped while waiting for one.
        if real:
            label = " (likely root cause: rank 0 failed in a collective after losing this peer)"
        shown = real or (failures if rank0 is None else {})
    elif codes[0]:
        shown = real  # lost peers follow from rank 0's own error, shown above
    else:
        shown = real or failures
    rank0_line = _last_line(str(rank0.get("text", ""))) if rank0 else None
    seen: set[str] = set()
    same: dict[str, list[int]] = {}
    for rank, report in sorted(shown.items()):
        text = str(report.get("text", ""))
        key = _last_line(text)
        if key == rank0_line:
            continue  # the same error as rank 0's, shown above
        if key in seen:
            same.setdefault(key, []).append(rank)
            continue
        seen.add(key)
        print(f"--- rank {rank}{label} ---\n{text}", file=sys.stderr, end="", flush=True)
    for key, ranks in same.items():
        _say(f"rank(s) {', '.join(map(str, ranks))} failed the same way: {key}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int] | None:
    """Exit codes of every process; a failure gives the others 15 s before they are stopped.

    Ranks left waiting in a collective for a peer that died would otherwise wait for the
    process group's timeout (30 minutes by default). None when ``timeout`` ran out.
    """
    deadline = time.monotonic() + timeout
    grace_deadline: float | None = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                return [_exit_code(c) for c in codes]
            if grace_deadline is None and any(c not in (None, 0) for c in codes):
                grace_deadline = time.monotonic() + 15.0
            limit = min(deadline, grace_deadline or deadline)
            if time.monotonic() >= limit:
                _stop(procs)
                if time.monotonic() >= deadline:
                    return None
                return [_exit_code(p.returncode) for p in procs]
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(procs)
        raise


def _exit_code(code: int | None) -> int:
    """A child's exit status as ours: killed by a signal (negative) or unknown counts as 1."""
    return code if code is not None and code >= 0 else 1


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
