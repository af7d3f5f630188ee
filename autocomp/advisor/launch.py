"""Spawn mode: the advisor plays torchrun for ``--nproc`` local ranks, and reports their failures.

Without a launcher's environment (``RANK`` unset), ``autocomp-advisor profile`` starts the
ranks itself over loopback. What that takes is kept here, apart from profiling: the processes,
a free port, a deadline, and the failure files through which ranks other than 0 hand their
errors to the parent -- which then decides which to show, because when one rank dies its
peers fail in their next collective too, and only one of those errors is the cause.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "ENV_RUNDIR",
    "ENV_SPAWNED",
    "free_port",
    "report_failure",
    "say",
    "show_failures",
    "spawned_rundir",
    "wait_all",
]

ENV_SPAWNED = "AUTOCOMP_ADVISOR_SPAWNED"
"""Set in the processes the advisor starts itself (not under the user's torchrun)."""
ENV_RUNDIR = "AUTOCOMP_ADVISOR_RUNDIR"
"""Directory where spawned ranks other than 0 leave their tracebacks for the parent."""

GRACE_S = 15.0
"""How long the other ranks get to finish once one has failed, before they are stopped."""


def say(message: str) -> None:
    """One line for the person at the terminal (stderr, prefixed)."""
    print(f"autocomp-advisor: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int] | None:
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
                grace_deadline = time.monotonic() + GRACE_S
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


# ---- failure reports --------------------------------------------------------------------------


def spawned_rundir() -> str | None:
    """The parent's failure-report directory when this process is a spawned rank, else None."""
    rundir = os.environ.get(ENV_RUNDIR)
    return rundir if os.environ.get(ENV_SPAWNED) and rundir else None


def report_failure(rundir: str, rank: int, text: str, *, peer_lost: bool) -> None:
    """Leave this rank's error for the spawning parent (see :func:`show_failures`)."""
    report = {"text": text, "peer_lost": peer_lost}
    Path(rundir, f"rank{rank}.failure.json").write_text(json.dumps(report))


def _read_failure(rundir: Path, rank: int) -> dict[str, Any] | None:
    try:
        report = json.loads((rundir / f"rank{rank}.failure.json").read_text())
    except (OSError, ValueError):
        return None  # killed (or stopped after the grace period) before it could report
    return report if isinstance(report, dict) else None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def show_failures(rundir: Path, codes: list[int]) -> None:
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
        say(f"rank(s) {', '.join(map(str, ranks))} failed the same way: {key}")
