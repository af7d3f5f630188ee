"""Tier 2: the README's quick start runs as written, and the controller it shows answers early.

- The first ``python`` block under "## Quick start" in README.md is written to a file and run
  with ``torchrun`` on 2 local gloo ranks (``python -m torch.distributed.run --standalone``);
  it must exit 0 and print ``ctl.summary()`` on both ranks. A launch that does not finish in
  time is killed with its whole process group.
- ``ctl.history`` and ``ctl.summary()``, which the README lists, work before any step and
  before the first window, in adaptive and static mode (2 gloo ranks).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from tests.models import MultiBucketNet, classification_batch
from tests.multirank import EXIT_ABORT, REPO, _aborted_at_exit, run_ranks, torchrun

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

LAUNCH_TIMEOUT_S = 180.0
# What Controller.summary() prints: a window's line, or the plan's before any window. Not
# anchored to a line start: the two ranks' prints can interleave on one line of the log.
SUMMARY = re.compile(r"step +\d+: (link |\d+/\d+ layers compressed)")


def quick_start_code(readme: Path = REPO / "README.md") -> str:
    """The first ```python block after the "## Quick start" heading."""
    text = readme.read_text(encoding="utf-8")
    heading = re.search(r"^## Quick start\s*$", text, re.MULTILINE)
    assert heading is not None, "README.md has no '## Quick start' section"
    block = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
    match = block.search(text, heading.end())
    assert match is not None, "no ```python block under '## Quick start'"
    following = re.search(r"^## ", text[heading.end() :], re.MULTILINE)
    if following is not None:
        assert match.start() < heading.end() + following.start(), (
            "the first python block after '## Quick start' is in a later section"
        )
    return match.group(1)


def test_quick_start_block_is_found() -> None:
    code = quick_start_code()
    assert "autocomp.wrap(" in code and "ctl.summary()" in code
    compile(code, "README.md quick start", "exec")


def test_only_pytorchs_exit_abort_earns_a_relaunch() -> None:
    """``torchrun`` relaunches once for gloo's abort at interpreter exit (it happens without
    autocomp too), never for a script that failed first."""
    done = "step 50: ...\n" + EXIT_ABORT + "\nfailed (exitcode: -6) local_rank: 1\nTraceback"
    assert _aborted_at_exit(done)
    crashed = "Traceback (most recent call last):\nValueError\n" + done
    assert not _aborted_at_exit(crashed)
    assert not _aborted_at_exit("failed (exitcode: 1) local_rank: 0\nTraceback")


def test_quick_start_runs_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(quick_start_code(), encoding="utf-8")
    output = torchrun(script, tmp_path, timeout_s=LAUNCH_TIMEOUT_S)
    summaries = SUMMARY.findall(output)
    assert len(summaries) == 2, f"expected ctl.summary() from both ranks:\n{output}"
    assert "Traceback" not in output, output


def _before_any_window(rank: int, world_size: int, run_dir: str) -> dict[str, object]:
    out: dict[str, object] = {}
    adaptive = autocomp.wrap(DDP(MultiBucketNet()), target_overlap=0.9, window=50, run_dir=run_dir)
    static_ddp = DDP(MultiBucketNet())
    static = autocomp.wrap(static_ddp, plan={"*.bias": "none", "*": "int8"})
    for name, ctl in (("adaptive", adaptive), ("static", static)):
        out[f"{name} history"] = list(ctl.history)
        out[f"{name} summary"] = ctl.summary()
    x, y = classification_batch(rank, 0)
    torch.nn.functional.cross_entropy(static_ddp(x), y).backward()
    out["static summary after a step"] = static.summary()
    out["static history after a step"] = list(static.history)
    return out


def test_history_and_summary_work_before_the_first_window(tmp_path: Path) -> None:
    results = run_ranks(_before_any_window, 2, tmp_path / "ranks", str(tmp_path / "runs"))
    for out in results:
        assert out["adaptive history"] == [] and out["static history"] == []
        assert str(out["adaptive summary"]).startswith("step      0: 0/")
        assert "no window boundary yet" in str(out["adaptive summary"])
        static = str(out["static summary"])
        assert re.match(r"step +0: \d+/\d+ layers compressed$", static), static
        after = str(out["static summary after a step"])
        assert after.startswith("step      1: ") and "fewer bytes than all-reduce" in after
        assert out["static history after a step"] == []
