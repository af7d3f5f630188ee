"""The time-to-accuracy benchmark (``autocomp-bench tta``).

Tier 1: its arithmetic on synthetic results: the penalty fraction, the oracle's choice, the
checks, the markdown and text reports (live and after a JSON round trip), option parsing.

Tier 2 (2 local gloo ranks on loopback, about 30 s): the benchmark end to end on a tiny
budget, one task and three methods; every method trains at least one step and both ranks
stop at the same step.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from autocomp_bench import tta
from autocomp_bench.harness import LoopbackNetwork, Rate, Runner, worker_pythonpath
from autocomp_bench.report import jsonable
from autocomp_bench.tta_analysis import (
    Cell,
    aggregate_seeds,
    choose_oracle,
    median_step,
    penalty_fraction,
    slow_steps,
    succeeded,
    summarize_run,
    tta_checks,
    tta_rows,
)
from autocomp_bench.tta_report import cell_rows, render_markdown, text_report
from autocomp_bench.worker import decision_trail, eval_points

# ---- tier 1 ----------------------------------------------------------------------------------


def test_penalty_fraction() -> None:
    assert penalty_fraction(1.0, 0.2, 0.1) == pytest.approx(0.8 / 0.9)
    assert penalty_fraction(1.0, 1.0, 0.1) == 0.0
    assert penalty_fraction(1.0, 1.2, 0.1) == pytest.approx(-0.2 / 0.9)  # slower than allreduce
    assert penalty_fraction(1.0, 0.05, 0.1) == pytest.approx(0.95 / 0.9)  # beat the limit
    assert penalty_fraction(0.1, 0.1, 0.1) is None  # no penalty to remove
    assert penalty_fraction(0.1, 0.1, 0.2) is None
    assert penalty_fraction(None, 0.1, 0.05) is None
    assert penalty_fraction(1.0, None, 0.05) is None


def test_median_step_skips_the_first_steps() -> None:
    assert median_step([9.0, 9.0, 9.0, 1.0, 2.0, 3.0]) == 2.0
    assert median_step([9.0, 1.0]) == 5.0  # too few steps: all of them
    assert median_step([]) is None


def test_slow_steps_name_where_the_time_beyond_the_median_went() -> None:
    # Median 1.0 (after the 3 skipped steps); step 0 (9 s) and step 5 (4 s) are slow.
    times = [9.0, 1.0, 1.0, 1.0, 1.0, 4.0, 1.0, 0.5, 1.5]
    spread = slow_steps(times)
    assert spread["excess_s"] == pytest.approx(sum(times) - 9 * 1.0)
    assert spread["slow_excess_s"] == pytest.approx(8.0 + 3.0)
    assert spread["slow_steps"] == 2
    assert spread["slowest"][:3] == [[0, 9.0], [5, 4.0], [8, 1.5]]
    assert slow_steps([]) == {"excess_s": 0.0, "slow_excess_s": 0.0, "slow_steps": 0, "slowest": []}


def test_eval_points_are_evenly_spaced_inside_the_budget() -> None:
    assert eval_points(60.0, 2) == pytest.approx([20.0, 40.0])
    assert eval_points(10.0, 0) == []


def _run(loss: float, accuracy: float | None = None, step: float = 0.1) -> dict[str, Any]:
    return {
        "steps": 100,
        "rank1_steps": 100,
        "median_step_s": step,
        "valid_loss": loss,
        "valid_accuracy": accuracy,
        "bytes_per_step": 1e6,
        "curve": [
            {"step": 50, "train_seconds": 5.0, "valid_loss": loss + 0.5},
            {"step": 100, "train_seconds": 10.0, "valid_loss": loss},
        ],
        "info": {},
    }


def test_oracle_takes_the_best_metric_of_the_grid() -> None:
    grid = {"fp16": _run(2.0), "psgd4": _run(1.9), "topk": {"error": "timed out"}}
    chosen = choose_oracle(grid, higher_is_better=False)
    assert chosen is not None and chosen[0] == "psgd4"
    # A classifier ranks by accuracy, even against a lower loss.
    grid = {"fp16": _run(0.10, 0.95), "psgd4": _run(0.08, 0.93)}
    chosen = choose_oracle(grid, higher_is_better=True)
    assert chosen is not None and chosen[0] == "fp16"
    # Ties keep the grid's order; nothing that succeeded: no oracle.
    chosen = choose_oracle({"a": _run(1.0), "b": _run(1.0)}, higher_is_better=False)
    assert chosen is not None and chosen[0] == "a"
    assert choose_oracle({"a": {"error": "rank 1 exited with 1"}}, False) is None


GPT = Cell("gpt", "50mbit", 50.0)
UNSHAPED = Cell("cnn", "unshaped", None, higher_is_better=True)


def _runs(loss: float, gpt_step: float, unshaped_step: float) -> list[dict[str, Any]]:
    """Synthetic summaries of two cells, tagged as the benchmark tags them: at 50 Mbit/s
    all-reduce takes 1 s per step and the limit 0.1 s; unshaped, 10 and 1 ms."""
    runs = []
    for cell, scale, step in ((GPT, 1.0, gpt_step), (UNSHAPED, 0.01, unshaped_step)):
        per_method = {
            "allreduce": _run(2.00, None, 1.00 * scale),
            "fp16": _run(2.01, None, 0.60 * scale),
            "powersgd": _run(2.10, None, 0.20 * scale),
            "limit": _run(2.60, None, 0.10 * scale),
            "adaptive": _run(loss, None, step),
        }
        for method, run in per_method.items():
            runs.append({"task": cell.task, "rate": cell.rate, "method": method, **run})
        for grid, grid_loss in (("fp16", 2.02), ("psgd4", 1.985)):
            runs.append(
                {"task": cell.task, "rate": cell.rate, "method": "oracle", "grid": grid}
                | _run(grid_loss, None, 0.3 * scale)
            )
    return runs


def test_rows_carry_the_penalty_removed_and_the_oracle_choice() -> None:
    rows = tta_rows(_runs(1.99, 0.14, 0.0101), [GPT, UNSHAPED], list(tta.METHODS))
    gpt = {r["method"]: r for r in rows if r["task"] == "gpt"}
    assert list(gpt) == list(tta.METHODS)
    assert gpt["adaptive"]["penalty_removed"] == pytest.approx((1.0 - 0.14) / 0.9)
    assert gpt["allreduce"]["penalty_removed"] == 0.0
    assert gpt["limit"]["penalty_removed"] == pytest.approx(1.0)
    assert gpt["oracle"]["oracle_choice"] == "psgd4"
    assert gpt["oracle"]["valid_loss"] == 1.985
    # Without the oracle among the methods, its grid runs make no row.
    rows = tta_rows(_runs(1.99, 0.14, 0.0101), [GPT], ["adaptive"])
    assert [r["method"] for r in rows] == ["adaptive"]


def test_seeds_make_one_row_of_means_and_keep_each_seeds_numbers() -> None:
    """Two seeds per method: the row holds the mean loss, the median steps and step time,
    and each seed's numbers; the oracle is chosen on the means, and the best-peer check
    reads the means and names adaptive's gap on each seed. A failed seed fails the row."""
    runs = []
    for seed, shift in ((0, 0.0), (1, 0.1)):
        for run in _runs(1.99 + shift, 0.14, 0.0101):
            steps = 100 + 10 * seed
            run = {**run, "seed": seed, "steps": steps, "rank1_steps": steps}
            if run["method"] == "oracle" and run["grid"] == "fp16":
                run["valid_loss"] = 2.2 - 0.3 * seed  # best on seed 1 only, worse on average
            runs.append(run)
    rows = tta_rows(runs, [GPT], list(tta.METHODS))
    gpt = {r["method"]: r for r in rows}
    assert gpt["adaptive"]["valid_loss"] == pytest.approx(1.99 + 0.05)
    assert gpt["adaptive"]["steps"] == 105 and gpt["adaptive"]["rank1_steps"] == 105
    assert [s["valid_loss"] for s in gpt["adaptive"]["per_seed"]] == pytest.approx([1.99, 2.09])
    assert gpt["oracle"]["oracle_choice"] == "psgd4"  # 1.985 against 2.05 on average
    (peer,) = [c for c in tta_checks(rows, [GPT]) if "best peer" in c.name]
    # Ahead of all-reduce on seed 0, behind on seed 1, behind on the mean: a failure.
    assert "means of 2 seeds; per seed -0.0100 / +0.0900" in peer.detail and not peer.passed
    table = {line[0]: line for line in cell_rows(rows, GPT)}
    assert table["adaptive"][3] == "2.0400"
    assert table["adaptive"][-1].endswith("per seed 1.9900 (100) / 2.0900 (110)")
    # The rank mismatch of one seed's run stays visible in the merged row.
    mismatched = {**aggregate_seeds([_run(1.0), {**_run(1.1), "rank1_steps": 99}])}
    assert mismatched["rank1_steps"] == -1
    mismatched.update(task=GPT.task, rate=GPT.rate, method="adaptive")
    assert cell_rows([mismatched], GPT)[0][-1].startswith("RANK 1 RAN OTHER STEP COUNTS")
    broken = aggregate_seeds([{**_run(1.0), "seed": 0}, {"error": "timed out", "seed": 1}])
    assert not succeeded(broken) and broken["error"] == "seed 1: timed out"
    assert aggregate_seeds([_run(1.0)]) == _run(1.0)


def _checks(loss: float, gpt_step: float, unshaped_step: float) -> dict[str, bool | None]:
    cells = [GPT, UNSHAPED]
    rows = tta_rows(_runs(loss, gpt_step, unshaped_step), cells, list(tta.METHODS))
    return {c.name: c.passed for c in tta_checks(rows, cells)}


def test_checks_pass_when_adaptive_meets_every_target() -> None:
    checks = _checks(1.99, 0.14, 0.0101)
    assert checks == {
        "gpt @ 50mbit: adaptive valid loss <= best peer's": True,
        "gpt @ 50mbit: adaptive valid loss <= oracle's + 0.02": True,
        "cnn @ unshaped: adaptive valid loss <= best peer's": True,
        "cnn @ unshaped: adaptive valid loss <= oracle's + 0.02": True,
        "gpt @ 50mbit: adaptive removes >= 95% of the penalty": True,
        "cnn @ unshaped: adaptive median step <= 1.03 x allreduce's": True,
        "cnn @ unshaped: adaptive valid loss <= allreduce's + 0.02": True,
    }


def test_checks_fail_on_each_missed_target() -> None:
    # Worse loss than allreduce's 2.00 but within the oracle's 1.985 + 0.02; too slow for the
    # penalty target (removes 0.8 / 0.9 = 89%); unshaped 10.4 ms > 1.03 x 10 ms.
    checks = _checks(2.0001, 0.20, 0.0104)
    assert checks["gpt @ 50mbit: adaptive valid loss <= best peer's"] is False
    assert checks["gpt @ 50mbit: adaptive valid loss <= oracle's + 0.02"] is True
    assert checks["gpt @ 50mbit: adaptive removes >= 95% of the penalty"] is False
    assert checks["cnn @ unshaped: adaptive median step <= 1.03 x allreduce's"] is False
    assert checks["cnn @ unshaped: adaptive valid loss <= allreduce's + 0.02"] is True
    checks = _checks(2.0201, 0.14, 0.0101)
    assert checks["cnn @ unshaped: adaptive valid loss <= allreduce's + 0.02"] is False
    assert checks["gpt @ 50mbit: adaptive valid loss <= oracle's + 0.02"] is False


def test_a_near_miss_of_the_penalty_target_prints_as_one() -> None:
    # (1 - 0.14527) / 0.9 = 94.97%: with one decimal it printed "95.0%" beside its FAIL.
    rows = tta_rows(_runs(1.99, 0.14527, 0.0101), [GPT, UNSHAPED], list(tta.METHODS))
    checks = {c.name: c for c in tta_checks(rows, [GPT])}
    check = checks["gpt @ 50mbit: adaptive removes >= 95% of the penalty"]
    assert check.passed is False
    assert check.detail.startswith("94.97% (allreduce 1.000 s, adaptive 0.145 s")


def test_checks_are_not_evaluated_without_the_runs() -> None:
    runs = [r for r in _runs(1.99, 0.14, 0.0101) if r["method"] not in ("limit", "oracle")]
    rows = tta_rows(runs, [GPT], ["allreduce", "fp16", "powersgd", "adaptive"])
    checks = {c.name: c for c in tta_checks(rows, [GPT])}
    assert checks["gpt @ 50mbit: adaptive valid loss <= best peer's"].passed is True
    oracle = checks["gpt @ 50mbit: adaptive valid loss <= oracle's + 0.02"]
    assert oracle.passed is None and oracle.line().startswith("FAIL (not evaluated)")
    assert checks["gpt @ 50mbit: adaptive removes >= 95% of the penalty"].passed is None


def _document() -> dict[str, Any]:
    cells = [GPT, UNSHAPED]
    rows = tta_rows(_runs(1.99, 0.14, 0.0101), cells, list(tta.METHODS))
    adaptive = next(i for i, r in enumerate(rows) if r["method"] == "adaptive")
    rows[adaptive] = {**rows[adaptive], "info": {"plan": {"fc.weight": "powersgd:rank=4"}}}
    config = tta.TimeToAccuracy.Config(tasks=["gpt", "cnn"], budget_s=10.0, evals=1)

    return {
        "benchmark": "autocomp_bench.tta",
        "command": "autocomp-bench tta --tasks gpt,cnn --budget-s 10",
        "code_digest": "0123456789abcdef",
        "code_source": "/src/autocomp-main",
        "machine": {
            "cpu": "test CPU",
            "usable_cpus": 2,
            "torch": "2.x",
            "torch_threads_per_rank": 1,
            "backend": "gloo",
            "network": "shaped",
        },
        "settings": {**asdict(config), "rates": ["50mbit", "unshaped"]},
        "cells": [asdict(c) for c in cells],
        "task_descriptions": {"gpt": "GPT-style byte LM", "cnn": "digits CNN"},
        "rows": rows,
        "checks": tta_checks(rows, cells),
        "runtime_s": 120.0,
    }


def test_markdown_and_text_reports_from_a_synthetic_result() -> None:
    live = jsonable(_document())
    saved = json.loads(json.dumps(live))
    markdown = render_markdown(saved)
    assert markdown == render_markdown(live)
    assert markdown.startswith("## Time to accuracy (`autocomp-bench tta`)")
    assert "Command: `autocomp-bench tta --tasks gpt,cnn --budget-s 10`" in markdown
    assert "Code 0123456789abcdef (from /src/autocomp-main)." in markdown  # which tree ran
    assert "### gpt @ 50mbit" in markdown and "### cnn @ unshaped" in markdown
    assert "| method | steps | median s/step | valid loss |" in markdown
    assert "| adaptive | 100 | 0.1400 | 1.9900 |" in markdown
    assert "95.6%" in markdown  # adaptive's penalty removed: 0.86 / 0.9
    assert "grid plan psgd4" in markdown
    assert "adaptive final plan: powersgd:rank=4: fc.weight" in markdown
    assert "PASS: gpt @ 50mbit: adaptive removes >= 95% of the penalty" in markdown
    assert "- `gpt`: GPT-style byte LM" in markdown
    text = "\n".join(text_report(saved))
    assert "gpt @ 50mbit:" in text and "checks:" in text
    assert text.count("PASS:") == 7


def test_exit_status_and_rendering_of_a_saved_document(tmp_path: Path) -> None:
    saved = json.loads(json.dumps(jsonable(_document())))
    args = argparse.Namespace(markdown=tmp_path / "tta.md", plot=None)
    assert tta._write_outputs(saved, args) == 0
    assert (tmp_path / "tta.md").read_text(encoding="utf-8").startswith("## Time to accuracy")
    saved["checks"][0]["passed"] = False
    assert tta._write_outputs(saved, args) == 1


def test_options_are_checked_before_anything_runs() -> None:
    assert list(tta.parse_grid("psgd4,fp16")) == ["psgd4", "fp16"]
    assert tta.parse_grid('{"mine": {"*.bias": "none", "*": "int8"}}') == {
        "mine": {"*.bias": "none", "*": "int8"}
    }
    with pytest.raises(ValueError, match="unknown grid plans"):
        tta.parse_grid("psgd5")
    with pytest.raises(ValueError):
        tta.parse_grid('{"bad": {"*": "nosuchcompressor"}}')
    assert tta.parse_adaptive_kwargs('{"target_overlap": 0.8, "window": 10}') == {
        "target_overlap": 0.8,
        "window": 10,
    }
    with pytest.raises(ValueError, match="unexpected keyword"):
        tta.parse_adaptive_kwargs('{"target_overlapp": 0.8}')
    with pytest.raises(ValueError, match="JSON object"):
        tta.parse_adaptive_kwargs("[1]")


def test_timeout_covers_the_budget_and_slow_steps() -> None:
    config = tta.TimeToAccuracy.Config(budget_s=60.0, evals=8)
    bench = tta.TimeToAccuracy(config, LoopbackNetwork(), Runner(LoopbackNetwork(), Path(".")))
    bench._gradient_bytes["ngram"] = 33_000_000
    fast = bench.timeout_s("ngram", Rate("unshaped", None))
    slow = bench.timeout_s("ngram", Rate("10mbit", 10.0))
    assert fast > 60.0 + tta.STARTUP_S
    # Two uncompressed steps of 33 MB at 10 Mbit/s (about 29 s each) on top, with slack.
    assert slow - fast >= 2 * 26.4 * 1.5


def test_workers_get_the_snapshot_then_the_callers_pythonpath_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers start in their run directory: a relative entry (an extra task's folder, say)
    must reach them as the folder it named where the benchmark was started."""
    monkeypatch.chdir(tmp_path)
    snapshot = tmp_path / "code"
    environ = {"PYTHONPATH": f"extra{os.pathsep}{os.pathsep}/abs/lib"}
    entries = worker_pythonpath(snapshot, environ).split(os.pathsep)
    assert entries == [str(snapshot), str(tmp_path / "extra"), "/abs/lib"]
    assert worker_pythonpath(None, environ).split(os.pathsep) == entries[1:]
    assert worker_pythonpath(snapshot, {}) == str(snapshot)
    assert worker_pythonpath(None, {}) == ""


def test_decision_trail_keeps_each_decisions_turns_in_brief() -> None:
    """The JSON keeps, per decision, the step, solver, predicted, compute-only and measured
    steps, the window's measured breakdown, and each optimizer layer's option with its reason
    (cut short); rule-placed layers and records without a decision (other ranks) are left
    out."""
    from types import SimpleNamespace

    long_reason = "least error within 3% of the fastest plan's step: " + "x" * 500
    decision = {
        "solver": "slack",
        "predicted_step_seconds": 0.71,
        "compute_seconds": 0.52,
        "fastest_step_seconds": 0.70,
        "bandwidth_bytes_per_s": 1.2e6,
        "layers": [
            {
                "name": "table",
                "spec": "topk",
                "predicted_seconds": 0.674,
                "rule": "slack",
                "reason": long_reason,
            },
            {
                "name": "bias",
                "spec": "none",
                "predicted_seconds": 0.001,
                "rule": "too_small",
                "reason": "too small",
            },
        ],
    }
    measured = {
        "predicted_step_seconds": 1.30,
        "compute_seconds": 0.61,
        "backward_seconds": 0.33,
        "hideable_seconds": 0.27,
        "comm_busy_seconds": 0.55,
        "compress_seconds": 0.04,
        "exposed_seconds": 0.72,
        "bytes_per_step": 3.5e5,
    }
    history = [
        SimpleNamespace(step=1, step_seconds=1.43, decision=decision, **measured),
        SimpleNamespace(step=2, step_seconds=1.15, decision=None, **measured),
    ]
    trail = decision_trail(history)
    assert len(trail) == 1
    entry = trail[0]
    assert (entry["step"], entry["solver"], entry["measured_step_s"]) == (1, "slack", 1.43)
    assert entry["predicted_step_s"] == 0.71 and entry["fastest_step_s"] == 0.70
    assert entry["compute_step_s"] == 0.52
    # What the window before the decision measured, beside what was predicted for it.
    assert entry["window_predicted_step_s"] == 1.30
    assert (entry["measured_compute_s"], entry["measured_comm_busy_s"]) == (0.61, 0.55)
    assert (entry["measured_work_s"], entry["measured_exposed_s"]) == (0.04, 0.72)
    assert entry["sent_bytes_per_step"] == 3.5e5
    assert (entry["measured_backward_s"], entry["measured_hideable_s"]) == (0.33, 0.27)
    assert list(entry["layers"]) == ["table"]
    spec, seconds, reason = entry["layers"]["table"]
    assert (spec, seconds) == ("topk", 0.674)
    assert len(reason) == 200 and reason.startswith("least error")
    json.dumps(trail)  # lands in the JSON as is


def test_error_runs_are_summarized_without_numbers() -> None:
    summary = summarize_run({"error": "timed out after 9 s", "wall_seconds": 9.0, "log_tail": ""})
    assert summary["error"] == "timed out after 9 s" and "steps" not in summary


# ---- tier 2 ----------------------------------------------------------------------------------


@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_tta_smoke_on_loopback(tmp_path: Path) -> None:
    out = tmp_path / "tta.json"
    status = tta.main(
        [
            "--network",
            "loopback",
            "--tasks",
            "cnn",
            "--methods",
            "allreduce,limit,adaptive",
            "--budget-s",
            "2",
            "--evals",
            "1",
            "--json",
            str(out),
            "--markdown",
            str(tmp_path / "tta.md"),
        ]
    )
    assert status in (0, 1)  # 1: a check failed, which a 2 s run may well do
    document = json.loads(out.read_text(encoding="utf-8"))
    assert document["cells"] == [
        {"task": "cnn", "rate": "unshaped (loopback)", "rate_mbit": None, "higher_is_better": True}
    ]
    rows = {row["method"]: row for row in document["rows"]}
    assert list(rows) == ["allreduce", "limit", "adaptive"]
    for method, row in rows.items():
        assert "error" not in row, (method, row.get("error"), row.get("log_tail"))
        assert row["steps"] >= 1, method
        assert row["steps"] == row["rank1_steps"], method
        assert row["train_seconds"] >= 2.0, method
        # One point in the middle of the budget (unless a single step took all of it), one
        # at the end, at the step the run stopped.
        curve = row["curve"]
        assert 1 <= len(curve) <= 2 and curve[-1]["step"] == row["steps"], method
        assert 0.0 < row["valid_accuracy"] <= 1.0 and row["valid_loss"] > 0, method
    assert rows["allreduce"]["bytes_per_step"] == pytest.approx(4 * rows["allreduce"]["numel"])
    assert rows["limit"]["bytes_per_step"] == 0.0
    assert rows["allreduce"]["penalty_removed"] in (0.0, None)
    names = [check["name"] for check in document["checks"]]
    assert "cnn @ unshaped (loopback): adaptive median step <= 1.03 x allreduce's" in names
    assert "| adaptive |" in (tmp_path / "tta.md").read_text(encoding="utf-8")
    trail = rows["adaptive"]["info"]["trail"]
    assert len(trail) == rows["adaptive"]["info"]["decisions"] >= 1
    # The solver is "" where rules alone decided (the warm-up, a fast link).
    assert all(isinstance(e["solver"], str) and isinstance(e["layers"], dict) for e in trail)
