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

Steps are counted at the last bucket of each backward of the first model that completes one.
After ``--steps`` of them, the next training forward raises :class:`_StopScript` (a
``BaseException``, so a script's ``except Exception`` does not swallow it); the runner catches
it, measures the link between the ranks (:mod:`autocomp.advisor.linkprobe`) and, on rank 0,
the compressors on the captured gradients (:mod:`autocomp.advisor.costs`), and writes the
profile (:mod:`autocomp.advisor.profile`).

Launching: under ``torchrun ... -m autocomp.advisor profile`` (``RANK`` in the environment)
each process profiles itself. Otherwise the advisor plays torchrun: it starts ``--nproc``
local processes with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1`` and
a free ``MASTER_PORT`` set, over loopback (gloo).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
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
    """Raised at a training forward once enough steps were captured; caught by the runner."""


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
        self.ddp = ddp
        self.index = index
        self.session = session
        self.module_class = type(ddp.module).__name__
        self.params = [(n, p) for n, p in ddp.module.named_parameters() if p.requires_grad]
        self.names = {id(p): n for n, p in self.params}
        self.hook_installed = False
        self.hook_note: str | None = None
        self.steps: list[_StepRecord] = []
        self.current: _StepRecord | None = None
        self.grad_norms: dict[str, float] = {}
        self.samples: dict[tuple[int, ...], torch.Tensor] = {}
        """One real averaged gradient per eligible shape (rank 0), for the compressor costs."""
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
            if len(self.steps) == 1:
                future.add_done_callback(functools.partial(self._sample, layout))
            if bucket.is_last():
                step.complete = True
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
        """First step: averaged gradient norms, and one gradient per shape for cost timing."""
        try:
            value = future.value()
            flat = value[0] if isinstance(value, (list, tuple)) else value
            offset = 0
            for name, shape in zip(layout.names, layout.shapes, strict=True):
                numel = shape.numel()
                piece = flat[offset : offset + numel].detach()
                offset += numel
                self.grad_norms[name] = float(torch.linalg.vector_norm(piece.double()))
                key = tuple(shape)
                wanted = self.session.keep_gradients and eligible(key, self.session.min_numel)
                if wanted and key not in self.samples:
                    self.samples[key] = piece.reshape(shape).to(torch.float32, copy=True)
        except Exception:  # never break the user's training because of the profiler
            logger.exception("autocomp-advisor: could not sample the first step's gradients")

    # ---- summary -----------------------------------------------------------------------------

    def completed_steps(self) -> list[_StepMetrics]:
        out = [_metrics(s) for s in self.steps]
        return [m for m in out if m is not None]

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
        with_next = [m.step_s for m in metrics if m.has_next] or [m.step_s for m in metrics]
        if not any(m.has_next for m in metrics):
            notes.append(
                f"model {self.index}: no forward followed the last step, so step time excludes "
                "the optimizer step"
            )
        step_s = statistics.median(with_next)
        exposed = statistics.median(m.exposed_s for m in metrics)
        hook = statistics.median(m.hook_s for m in metrics)
        backward = statistics.median(m.backward_s for m in metrics)
        first = statistics.median(m.first_ready_s for m in metrics)
        timing = Timing(
            steps_used=len(metrics),
            forward_s=statistics.median(m.forward_s for m in metrics),
            backward_s=backward,
            first_bucket_ready_s=first,
            last_bucket_ready_s=backward,
            hideable_s=max(0.0, backward - first),
            step_s=step_s,
            exposed_comm_s=exposed,
            hook_s=hook,
            compute_step_s=max(step_s - exposed - hook, 1e-9),
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
        layers = tuple(
            LayerInfo(
                name=name,
                shape=tuple(p.shape),
                dtype=str(p.dtype).removeprefix("torch."),
                bucket=bucket_of.get(name),
                grad_norm=self.grad_norms.get(name, 0.0),
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
        metrics = self.completed_steps()
        used = metrics[1:] if len(metrics) >= 2 else metrics
        return statistics.median(m.step_s for m in used) if used else 0.0


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
        self.primary: ModelCapture | None = None
        self.steps_done = 0
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
            return original_register(ddp, state, capture.timed(hook))

        @functools.wraps(original_destroy)
        def destroy(group: dist.ProcessGroup | None = None) -> None:
            if group is None:
                session.destroy_requested = True  # after the link measurement
                return None
            return original_destroy(group)

        cls.__init__ = init  # type: ignore[method-assign]
        cls.register_comm_hook = register  # type: ignore[method-assign]
        dist.destroy_process_group = destroy
        try:
            yield
        finally:
            cls.__init__ = original_init  # type: ignore[method-assign]
            cls.register_comm_hook = original_register  # type: ignore[method-assign]
            dist.destroy_process_group = original_destroy

    def capture_of(self, ddp: DistributedDataParallel) -> ModelCapture | None:
        return next((m for m in self.models if m.ddp is ddp), None)

    def install_default_hook(self, capture: ModelCapture) -> None:
        capture.hook_installed = True
        assert self._register is not None
        try:
            self._register(capture.ddp, capture.ddp.process_group, capture.timed(_allreduce_hook))
        except Exception as err:  # e.g. a built-in hook registered by the script
            capture.hook_note = f"could not time its buckets: {err}"
            logger.warning("autocomp-advisor: model %d: %s", capture.index, capture.hook_note)

    def step_completed(self, capture: ModelCapture) -> None:
        if self.primary is None:
            self.primary = capture
        if capture is self.primary:
            self.steps_done += 1
            self.progress.update(self.steps_done)

    def maybe_stop(self, t: float) -> None:
        if self.primary is not None and self.steps_done >= self.target:
            for capture in self.models:
                capture.close_step(t)
            raise _StopScript

    def destroy_process_group(self) -> None:
        """The real destroy, if a process group is still up."""
        destroy = self._destroy or dist.destroy_process_group
        if dist.is_available() and dist.is_initialized():
            destroy()


# ---- running one rank ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Outcome:
    kind: str
    """'stopped' (enough steps), 'finished' (the script ended), 'error' (it raised)."""
    detail: str = ""


def _script_traceback(err: BaseException, script: Path) -> str:
    """The exception's traceback from the script's first frame on (the runner's hidden)."""
    target = os.path.realpath(script)
    tb = err.__traceback__
    cursor = tb
    while cursor is not None and os.path.realpath(cursor.tb_frame.f_code.co_filename) != target:
        cursor = cursor.tb_next
    return "".join(traceback.format_exception(type(err), err, cursor or tb))


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
                return 1
            if codes[0] == 0 and any(codes):
                for rank, code in enumerate(codes):
                    err = Path(rundir) / f"rank{rank}.err"
                    if code and err.exists():
                        print(f"--- rank {rank} ---\n{err.read_text()}", file=sys.stderr)
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
            if rank == 0 and outcome.kind == "error":
                _say("the script failed before it built a DDP model; no profile was written")
            elif rank == 0:
                _say(NO_DDP_MESSAGE)
            return 1
        steps = session.steps_done
        if steps == 0:
            if rank == 0 and outcome.kind != "error":
                _say(
                    "the script built a DDP model but no backward went through it, so no step "
                    "was captured; does it train (loss.backward()) with gradients enabled?"
                )
            elif rank == 0:
                _say("no step was captured, so no profile was written")
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
            return _Outcome("finished")
        except _StopScript:
            return _Outcome("stopped")
        except SystemExit as exit_:
            code = exit_.code
            if code in (None, 0):
                return _Outcome("finished")
            return self._failed(f"the script exited with status {code}", rank, "")
        except Exception as err:
            text = _script_traceback(err, cfg.script)
            return self._failed(f"the script raised {type(err).__name__}: {err}", rank, text)
        finally:
            sys.argv = saved_argv
            sys.path[:] = saved_path

    def _failed(self, detail: str, rank: int, text: str) -> _Outcome:
        rundir = os.environ.get(ENV_RUNDIR)
        if rank != 0 and os.environ.get(ENV_SPAWNED) and rundir:
            # The parent shows these only if rank 0 did not fail itself (no duplicates).
            Path(rundir, f"rank{rank}.err").write_text(text or detail + "\n")
        elif text:
            if rank != 0:
                print(f"--- rank {rank} ---", file=sys.stderr)
            print(text, file=sys.stderr, end="", flush=True)
        return _Outcome("error", detail)

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
                notes.append(
                    f"model {capture.index} ({capture.module_class}) never completed a step"
                )
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
                f"kept the partial profile of the {session.steps_done} step(s) captured before "
                f"the error in {cfg.out}"
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
