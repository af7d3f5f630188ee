"""The capture session: what is patched in torch while a user's script runs, and when it stops.

``autocomp-advisor profile train.py`` must work on the script people already have, so nothing
in the script changes. Instead, while it runs (via :mod:`runpy`, in this process):

* ``DistributedDataParallel.__init__`` is wrapped: after DDP's own constructor, the model is
  handed to a :class:`~autocomp.advisor.capture.ModelCapture`, which instruments it;
* ``register_comm_hook`` is wrapped, so that a script's own comm hook (``autocomp.wrap``
  registers one) is instrumented instead of the default one, and keeps working; a built-in
  (C++) hook cannot be, which the profile then says;
* ``torch.distributed.destroy_process_group()`` is deferred until the profiler is done, since
  the link is measured with the script's process group after its steps.

A script's optimizer iterations are the backwards of the model that completed the fewest: a
GAN's discriminator syncs twice per iteration (its own loss and the generator's), the
generator once. Once every model that completed a backward reached ``--steps``, the next
training forward raises :class:`_StopScript` (a ``BaseException``, so a script's
``except Exception`` does not swallow it).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from autocomp.advisor.capture import ModelCapture

logger = logging.getLogger(__name__)

__all__ = ["CaptureSession"]


class _StopScript(BaseException):
    """Raised at a training forward once enough steps were captured; caught by the runner.

    Its message explains itself, since a script with a bare ``except:`` may print it.
    """


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
            result = original_register(ddp, state, capture.adopt(state, hook))
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
        """Before a model's first forward, when the script registered no hook of its own."""
        capture.hook_installed = True
        assert self._register is not None
        try:
            capture.install_default_hook(self._register)
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

    def maybe_stop(self) -> None:
        """At a training forward: stop the script once enough steps were captured."""
        if self.stop_raised or self.steps_done >= self.target:
            self.finish()
            self.stop_raised = True
            raise _StopScript(
                f"autocomp-advisor: {self.steps_done} steps captured, stopping the script "
                "(this is not an error)"
            )

    def finish(self) -> None:
        """The script stopped (or ended): close every model's last step."""
        for capture in self.models:
            capture.finish()

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
