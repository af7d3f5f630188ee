"""Python callbacks on collective futures, finished before the interpreter finishes.

A future's callbacks run on the backend's worker thread (gloo's work loop, or the thread that
completes a CUDA future), and each takes the GIL: to run, and once more after it returns, when
PyTorch drops its reference to the function. DDP resumes the main thread as soon as the future
it waits on completes, which can happen inside a callback (a bucket's result set from a
``collect_all`` callback) or just before PyTorch releases it. A script that ends right after
its last backward can then reach interpreter finalization while a worker thread still needs
the GIL, and Python ends such a thread with ``pthread_exit``. Unwinding through PyTorch's C++
frames, that aborts the process ("terminate called without an active exception", exit status
134, which torchrun reports as a failed rank), or silently drops what the callback had left.
On a 2-rank gloo script that trains 40 steps and exits, 8 of 80 rank exits aborted this way
(2026-11-27; gdb on the cores: a gloo worker in ``take_gil`` from ``PythonFunctionGuard``'s
destructor or from ``Future.set_result``, the main thread in ``Py_FinalizeEx``).

Every Python callback autocomp puts on a future goes through :func:`add_done_callback` or
:func:`then`, and every job the hierarchical hook hands its worker threads (which complete the
bucket's future the same way, from a daemon thread) through :func:`tracked`. They count what
was registered and has not returned yet, and an ``atexit`` handler (run while the interpreter
is fully alive) waits for that count to reach zero, within ``EXIT_WAIT_SECONDS`` for futures
that never complete, then sleeps ``RELEASE_SECONDS`` with the GIL released so the workers can
drop their references. The count and the deferred release below cost about 1.4 µs a
callback (registration, run and release: 2.3 against 0.9 µs for a bare
``add_done_callback``; a plain bucket has one callback, a compressed one a few).

What a callback's function refers to is never released on the thread that ran it. A bucket's
decode holds the hook state, and through it the process group; once the main thread has moved
on, dropped the model and destroyed the group, that function can hold the group's last
reference. Released on the group's own gloo worker, the group's destructor joins that very
thread, and the process aborts ("terminate called after throwing an instance of
'std::system_error' what(): Resource deadlock avoided"; CI, 2026-11-27, a Lightning example
that frees its trainer before ``destroy_process_group``; ``tests/test_callbacks.py``
reproduces it every time, with PyTorch's own ``add_done_callback`` too). So each function is
handed, once it has returned, to a queue that the next registration outside any callback
empties (the hook's thread: main or autograd, never a collective's worker), and the exit
empties it last, on the main thread, where PyTorch's group destructor releases the GIL as it
joins its workers.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import torch

logger = logging.getLogger(__name__)

__all__ = [
    "EXIT_WAIT_SECONDS",
    "RELEASE_SECONDS",
    "add_done_callback",
    "pending",
    "release_finished",
    "then",
    "tracked",
]

EXIT_WAIT_SECONDS = 5.0
"""The longest the exit waits for callbacks still to run (a future that never completes, such
as one of a collective a crashed peer never joined, must not hold the exit for long)."""
RELEASE_SECONDS = 0.05
"""The GIL-free pause after the last callback returned: the worker thread takes the GIL once
more to drop the function, right after the callback returns."""

T = TypeVar("T")
P = ParamSpec("P")

_lock = threading.Lock()
_pending = 0
_exit_handler_registered = False
_finished: deque[Callable[..., Any]] = deque()
"""Functions that have run, held until a thread that runs no callback releases them."""
_running = threading.local()
"""``depth``: callbacks this thread is inside (a ``then`` on a completed future nests)."""


def pending() -> int:
    """Callbacks registered through this module that have not returned yet."""
    with _lock:
        return _pending


def release_finished() -> None:
    """Drop what the callbacks that have run referred to, on this thread.

    Called at every registration made outside a callback, at ``close()`` and at exit; a no-op
    inside a callback (on a collective's worker). Not under ``_lock``: the last reference to
    a process group joins its workers, which may be about to return from a callback and take
    the lock.
    """
    if getattr(_running, "depth", 0):
        return
    while _finished:
        try:
            _finished.popleft()
        except IndexError:  # another thread took the last one
            return


def _started_waiting() -> None:
    global _pending, _exit_handler_registered
    release_finished()
    with _lock:
        _pending += 1
        if not _exit_handler_registered:
            atexit.register(_finish_before_exit)
            _exit_handler_registered = True


def _returned() -> None:
    global _pending
    with _lock:
        _pending -= 1


def tracked(function: Callable[P, T]) -> Callable[P, T]:
    """``function``, waited for at exit from now until one call of it returns (call it once:
    a callback, or a job for a worker thread); what it refers to is released later, by
    :func:`release_finished`, not on the thread that called it."""
    _started_waiting()
    held = [function]

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        if not held:
            raise RuntimeError("autocomp: a tracked callback was called a second time")
        call = held.pop()
        depth = getattr(_running, "depth", 0)
        _running.depth = depth + 1
        try:
            return call(*args, **kwargs)
        finally:
            _running.depth = depth
            _finished.append(call)
            del call
            _returned()

    return run


def add_done_callback(
    future: torch.futures.Future, callback: Callable[[torch.futures.Future], None]
) -> None:
    """``future.add_done_callback(callback)``, finished before the interpreter exits."""
    counted = tracked(callback)
    try:
        future.add_done_callback(counted)
    except BaseException:
        _returned()  # never registered: nothing to wait for
        raise


def then(
    future: torch.futures.Future, callback: Callable[[torch.futures.Future], Any]
) -> torch.futures.Future:
    """``future.then(callback)``, finished before the interpreter exits."""
    counted = tracked(callback)
    try:
        return future.then(counted)
    except BaseException:
        _returned()
        raise


def _finish_before_exit() -> None:
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    while (left := pending()) > 0:
        if time.monotonic() >= deadline:
            logger.warning(
                "autocomp: %d collective callback(s) had not run %.0f s after the program "
                "ended; exiting without them",
                left,
                EXIT_WAIT_SECONDS,
            )
            return
        time.sleep(0.001)
    time.sleep(RELEASE_SECONDS)
    release_finished()  # the main thread: a group's last reference may go here
