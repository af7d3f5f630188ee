"""Tier 2: the test suite's own rank launcher (``tests.multirank.run_ranks``), on 2 gloo ranks.

Ranks fork from a server started once per session, so what a spawned process got for free is
checked here: the test's environment and working directory reach the rank, atexit handlers
run, and a rank that raises, dies in native code or hangs fails the test with what it printed.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.multirank import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(120)]


def _report_environment(rank: int, world_size: int, marker_file: str) -> dict[str, str]:
    def leave_marker() -> None:
        Path(marker_file).with_suffix(f".{rank}").write_text("atexit ran")

    atexit.register(leave_marker)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    return {
        "marker": os.environ.get("AUTOCOMP_TEST_HARNESS_MARKER", ""),
        "cwd": os.getcwd(),
        "sum": str(float(total)),
    }


def test_each_rank_gets_the_tests_environment_and_directory_and_runs_atexit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Twice, with other values: the second run's ranks fork from a server that was already
    # running (with the first run's environment, or an earlier test's) before they were set.
    for run in ("first", "second"):
        monkeypatch.setenv("AUTOCOMP_TEST_HARNESS_MARKER", f"set by the {run} run")
        here = tmp_path / run
        here.mkdir()
        monkeypatch.chdir(here)
        marker = tmp_path / f"marker-{run}"
        results = run_ranks(_report_environment, 2, tmp_path / "ranks", str(marker))
        for rank, result in enumerate(results):
            assert result == {"marker": f"set by the {run} run", "cwd": str(here), "sum": "3.0"}
            assert marker.with_suffix(f".{rank}").read_text() == "atexit ran"


def _misbehave(rank: int, world_size: int, how: str) -> None:
    print(f"rank {rank} says where it got to", flush=True)
    if rank == 1:
        if how == "raise":
            raise ValueError("a rank-local failure")
        if how == "die":
            os._exit(7)  # no traceback, as a native abort leaves none
        if how == "hang":
            time.sleep(60)
    sys.stdout.flush()


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("raise", "ValueError: a rank-local failure"),
        ("die", "gave no result (rank 1 exit 7)"),
        ("hang", "did not finish within 4s (hang)"),
    ],
)
def test_a_failing_rank_fails_the_test_and_says_why(
    tmp_path: Path, how: str, expected: str
) -> None:
    with pytest.raises(AssertionError) as failure:
        run_ranks(_misbehave, 2, tmp_path, how, timeout=4)
    message = str(failure.value)
    assert expected in message
    if how != "raise":  # no traceback: the rank's own output is quoted
        assert "rank 1 says where it got to" in message


def _rank_number(rank: int, world_size: int) -> int:
    return rank


def test_a_second_run_in_the_same_folder_reports_its_own_results(tmp_path: Path) -> None:
    with pytest.raises(AssertionError):
        run_ranks(_misbehave, 2, tmp_path, "raise", timeout=30)
    assert run_ranks(_rank_number, 2, tmp_path) == [0, 1]
