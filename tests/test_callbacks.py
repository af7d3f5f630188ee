"""Tier 1 (pure unit) and tier 1.5 (one gloo rank in a subprocess): callbacks on collective
futures finish before the interpreter does.

- :func:`autocomp.callbacks.pending` counts a callback from its registration until it
  returns, raised or not, for ``add_done_callback``, ``then`` and ``tracked`` (the
  hierarchical hook's worker jobs).
- A callback that releases the main thread (it completes the future the main thread waits on,
  as a bucket's result does for DDP) and still has Python to run finishes before the process
  exits. With a plain ``add_done_callback`` the interpreter's finalization ends the worker
  thread and its work is lost (or, unwinding through PyTorch's C++ frames, the process aborts).
- The exit's wait is bounded: a future that never completes does not hold it.
- What a callback refers to is released by the next registration outside a callback or at
  exit, never on the thread that ran it: a callback holding a process group's last reference
  would otherwise destroy the group on the group's own gloo worker, which aborts the process
  ("Resource deadlock avoided"; two gloo ranks in subprocesses).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path

import pytest
import torch

from autocomp import callbacks

_LATE_CALLBACK = """
import sys, time
import torch, torch.distributed as dist
from autocomp import callbacks

store = dist.FileStore(sys.argv[1], 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
held = dist.group.WORLD  # a DDP model keeps its group (and its worker threads) alive
fut = dist.all_reduce(torch.ones(4), async_op=True).get_future()
released = torch.futures.Future()

def callback(_):
    released.set_result(None)  # the main thread may go on from here
    time.sleep(0.3)  # the worker thread still has Python to run
    open(sys.argv[2], "w").write("finished")

if sys.argv[3] == "autocomp":
    callbacks.add_done_callback(fut, callback)
else:
    fut.add_done_callback(callback)
released.wait()
dist.destroy_process_group()
"""

# Rank 0 holds a group's last reference in a callback that runs on the group's gloo worker
# (rank 1 joins the collective only once rank 0 has registered the callback, so it runs when
# the collective completes, on the worker). The main thread destroys the group and lets go of
# it while the callback runs; the exit releases what the callback held, on the main thread.
_LAST_REFERENCE = """
import subprocess, sys, threading, time
import torch, torch.distributed as dist
from autocomp import callbacks

store_path, rank = sys.argv[1], int(sys.argv[2])
if rank == 0:
    peer = subprocess.Popen([sys.executable, __file__, store_path, "1"])
store = dist.FileStore(store_path, 2)
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
group = dist.new_group([0, 1])
if rank == 1:
    store.wait(["registered"])
    dist.all_reduce(torch.ones(4), group=group)
    dist.destroy_process_group(group)
    del group
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0)

running, let_go = threading.Event(), threading.Event()

def register(future, group):
    def callback(_):
        running.set()
        let_go.wait(10)
        assert group is not None  # the closure holds the group

    callbacks.add_done_callback(future, callback)

register(dist.all_reduce(torch.ones(4), group=group, async_op=True).get_future(), group)
store.set("registered", "1")
running.wait(10)
dist.destroy_process_group(group)
del group  # the callback's closure holds the group's last reference from here
let_go.set()
time.sleep(0.3)  # the worker returns from the callback and lets go of it
dist.barrier()
dist.destroy_process_group()
sys.exit(peer.wait())
"""


def _run(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[1],
    )


def test_pending_counts_from_registration_until_return() -> None:
    base = callbacks.pending()
    future: torch.futures.Future[int] = torch.futures.Future()
    seen: list[int] = []
    callbacks.add_done_callback(future, lambda f: seen.append(f.value()))
    chained = callbacks.then(future, lambda f: f.value() + 1)

    def fails(_: torch.futures.Future[int]) -> None:
        raise RuntimeError("a callback that raises still returns")

    callbacks.add_done_callback(future, fails)
    job = callbacks.tracked(lambda a, b=0: a + b)  # a worker thread's job
    assert callbacks.pending() == base + 4  # registered, not yet run
    future.set_result(41)
    assert seen == [41]
    assert chained.wait() == 42
    assert callbacks.pending() == base + 1
    assert job(1, b=2) == 3
    assert callbacks.pending() == base


class _RefusingFuture:
    """A future whose registration fails (as a torch future can, given the wrong arguments)."""

    def add_done_callback(self, callback: object) -> None:
        raise RuntimeError("refused")

    def then(self, callback: object) -> None:
        raise RuntimeError("refused")


def test_a_failed_registration_is_not_waited_for() -> None:
    base = callbacks.pending()
    with pytest.raises(RuntimeError, match="refused"):
        callbacks.add_done_callback(_RefusingFuture(), lambda f: None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="refused"):
        callbacks.then(_RefusingFuture(), lambda f: None)  # type: ignore[arg-type]
    assert callbacks.pending() == base


@pytest.mark.timeout(120)
def test_a_late_callback_finishes_before_exit(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    out = _run(tmp_path, _LATE_CALLBACK, str(tmp_path / "store"), str(marker), "autocomp")
    assert out.returncode == 0, out.stderr[-2000:]
    assert marker.read_text() == "finished"


@pytest.mark.timeout(120)
def test_the_exit_does_not_wait_forever_for_a_future_that_never_completes(
    tmp_path: Path,
) -> None:
    code = """
    import logging, torch
    from autocomp import callbacks

    logging.basicConfig()
    callbacks.EXIT_WAIT_SECONDS = 0.5
    never = torch.futures.Future()  # nobody completes it
    callbacks.add_done_callback(never, lambda f: None)
    """
    started = time.monotonic()
    out = _run(tmp_path, code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert time.monotonic() - started < 30
    assert "1 collective callback(s) had not run" in out.stderr


def test_a_callbacks_references_are_released_off_its_thread() -> None:
    future: torch.futures.Future[None] = torch.futures.Future()
    freed_on: list[int] = []

    class Held:  # stands for the hook state and its process group
        pass

    held = Held()
    weakref.finalize(held, lambda: freed_on.append(threading.get_ident()))
    released_inside: list[bool] = []

    def register(obj: Held) -> None:
        def callback(_: torch.futures.Future[None]) -> None:
            callbacks.release_finished()  # a no-op inside a callback (a worker thread)
            released_inside.append(obj is not None)

        callbacks.add_done_callback(future, callback)

    register(held)
    del held
    worker = threading.Thread(target=future.set_result, args=(None,))  # runs the callback
    worker.start()
    worker.join()
    assert released_inside == [True]
    assert freed_on == []  # the worker did not release it
    callbacks.release_finished()
    assert freed_on == [threading.get_ident()]


def test_a_tracked_function_runs_once() -> None:
    job = callbacks.tracked(lambda: 1)
    assert job() == 1
    with pytest.raises(RuntimeError, match="called a second time"):
        job()


@pytest.mark.timeout(120)
def test_a_groups_last_reference_in_a_callback_is_released_on_the_main_thread(
    tmp_path: Path,
) -> None:
    out = _run(tmp_path, _LAST_REFERENCE, str(tmp_path / "store"), "0")
    assert "Resource deadlock avoided" not in out.stderr, out.stderr[-2000:]
    assert out.returncode == 0, out.stderr[-2000:]
