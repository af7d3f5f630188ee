"""Run a function on N local gloo ranks (forkserver processes, FileStore rendezvous), or a
script under torchrun (:func:`torchrun`).

Each rank returns a picklable value; a rank that raises reports its traceback, and ranks that
do not finish in time are killed and reported as hung, so a broken collective fails the test
instead of stalling the suite.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import os
import pickle
import signal
import subprocess
import sys
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVE_TIMEOUT_S = 60

# Ranks fork from a server that has imported these once per pytest session. A spawned rank
# re-imported torch (~2.5 s of CPU) and finalized it at exit (~1.6 s); forked from the warm
# server, a 3-rank run of test_uncompressed_layers_get_plain_ddps_bits took 3.7 s instead of
# 7.4-9.1 s (2026-11-28). ``DDP.__init__`` imports ``torch._dynamo`` on first use and
# ``autocomp.wrap`` imports scikit-learn's ensemble (the cost model's regressor): ~2.5 s and
# ~1.6 s of CPU in every rank of every test. Preloaded, a 4-rank refusal test went from 5.3 s
# to 2.1 s and tests/test_hook_multirank.py with tests/test_hierarchy.py from ~162 s to 110 s
# (2026-11-29). Only third-party modules are preloaded: autocomp and the test modules are
# imported by each rank, so what they read at import time comes from the test's own
# environment.
FORKSERVER_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",
    "sklearn.ensemble",
]


def _rank_context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    workdir: str,
    store_path: str,
    args: tuple[Any, ...],
    environ: dict[str, str],
    cwd: str,
) -> None:
    # A forked rank starts with the server's environment and directory, fixed when the server
    # started; give it the test's, as a spawned process would have had.
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    out = Path(workdir) / f"rank{rank}"
    # Its stdout and stderr are the server's too (whichever test started it); send them to a
    # file of this run, which a failure report quotes.
    sys.stdout.flush()
    sys.stderr.flush()
    with open(out.with_suffix(".log"), "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("AUTOCOMP_RUN_DIR", str(Path(workdir) / "runs"))
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        try:
            result = fn(rank, world_size, *args)
        finally:
            # DDP models sit in reference cycles; free them, and the futures their reducers
            # keep, while the group and the interpreter are alive. Left to finalization, gloo
            # aborted a rank at exit now and then ("terminate called without an active
            # exception"), which fails the test after the work is done.
            gc.collect()
            dist.destroy_process_group()
        out.with_suffix(".ok").write_bytes(pickle.dumps(result))
    except BaseException:
        out.with_suffix(".err").write_text(traceback.format_exc())
        raise SystemExit(1) from None
    finally:
        # A forked process ends in os._exit, which skips atexit; autocomp's run log flushes
        # its queue there, as it would at a real rank's exit.
        atexit._run_exitfuncs()


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    workdir: Path,
    *args: Any,
    timeout: float = 180.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return their results.

    Raises AssertionError naming, in one message, every rank that raised (its traceback),
    hung, or exited without a result (its exit code); the latter two with their output.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    for rank in range(world_size):  # a previous run's results in the same folder are not ours
        for suffix in (".ok", ".err", ".log"):
            (workdir / f"rank{rank}{suffix}").unlink(missing_ok=True)
    # A store file of this run's own: the last rank out of a run deletes its FileStore, but a
    # second run in the same folder once found the first run's file still there, with both
    # ranks' addresses in it, and a rank that read its peer's stale address hung in the
    # rendezvous (tests/test_multirank_harness.py, CI on 2026-11-30).
    store_path = str(workdir / f"store-{uuid.uuid4().hex}")
    ctx = _rank_context()
    environ, cwd = dict(os.environ), os.getcwd()
    procs = [
        ctx.Process(
            target=_entry,
            args=(fn, rank, world_size, str(workdir), store_path, args, environ, cwd),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    deadline = timeout
    import time

    start = time.monotonic()
    for proc in procs:
        proc.join(max(0.0, deadline - (time.monotonic() - start)))
    hung = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    # Everything that went wrong, in one report: a rank that died can make another fail
    # (gloo errors on a peer gone), and the report must still name the first.
    errors = rank_errors(workdir, world_size)
    problems = []
    if errors:
        details = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
        problems.append(f"ranks {sorted(errors)} failed:\n{details}")
    if hung:
        problems.append(
            f"ranks {hung} did not finish within {timeout:.0f}s (hang)\n"
            + _log_tails(workdir, hung)
        )
    # Killed, or aborted in native code: no traceback was written, the output may say why.
    died = [
        r
        for r in range(world_size)
        if r not in errors and r not in hung and not (workdir / f"rank{r}.ok").exists()
    ]
    if died:
        codes = ", ".join(f"rank {r} exit {procs[r].exitcode}" for r in died)
        problems.append(f"ranks {died} gave no result ({codes})\n" + _log_tails(workdir, died))
    if problems:
        raise AssertionError("\n".join(problems))
    return [pickle.loads((workdir / f"rank{r}.ok").read_bytes()) for r in range(world_size)]


def _log_tails(workdir: Path, ranks: list[int], lines: int = 40) -> str:
    """The last lines each rank printed (stdout and stderr), for a failure report."""
    parts = []
    for rank in ranks:
        log = workdir / f"rank{rank}.log"
        text = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
        parts.append(f"--- rank {rank} output (last {lines} lines) ---\n" + "\n".join(text))
    return "\n".join(parts)


def rank_errors(workdir: Path, world_size: int) -> dict[int, str]:
    """Tracebacks of the ranks that failed in ``workdir`` (for tests that expect failure)."""
    return {
        r: (workdir / f"rank{r}.err").read_text()
        for r in range(world_size)
        if (workdir / f"rank{r}.err").exists()
    }


REPO = Path(__file__).resolve().parent.parent


def torchrun(
    script: Path,
    cwd: Path,
    *args: str,
    nproc: int = 2,
    timeout_s: float = 180.0,
    env: dict[str, str] | None = None,
) -> str:
    """Run ``script`` with ``torch.distributed.run --standalone`` on ``nproc`` local gloo ranks,
    as a user would; return its combined output.

    Runs in ``cwd`` with autocomp's run logs there too, so nothing lands in the repo. A launch
    that does not finish in time is killed (its whole process group) and fails, as does one
    that exits non-zero.
    """
    environ = dict(os.environ)
    environ.update(
        AUTOCOMP_RUN_DIR=str(cwd / "runs"),
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")])),
        **(env or {}),
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(script),
        *args,
    ]
    relaunched = False
    for _attempt in range(2):
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            pytest.fail(f"{script.name} did not finish in {timeout_s:.0f}s:\n{output[-6000:]}")
        if proc.returncode == 0 or relaunched or not _aborted_at_exit(output):
            break
        # Once, and only for PyTorch's own exit-time abort (see _aborted_at_exit).
        relaunched = True
    if relaunched and proc.returncode == 0:
        print(f"{script.name}: a rank aborted at interpreter exit; the relaunch passed")
    assert proc.returncode == 0, f"{script.name} failed (exit {proc.returncode}):\n{output[-8000:]}"
    return output


EXIT_ABORT = "terminate called without an active exception"


def _aborted_at_exit(output: str) -> bool:
    """A rank died of SIGABRT with gloo's exit-time message and nothing else went wrong.

    torch 2.13 with gloo aborts a rank at interpreter exit now and then, after the script
    is done, without autocomp: the README's quick start with ``autocomp.wrap`` removed and
    ``import autocomp`` dropped failed 4 of 30 launches here (2026-11-24), with autocomp 5 of
    30. A test of what the script did must not fail on that, so ``torchrun`` relaunches such
    a run once; any other failure, or the abort twice, still fails.
    """
    script_failed = "Traceback" in output.split(EXIT_ABORT)[0]
    return EXIT_ABORT in output and "exitcode: -6" in output and not script_failed
