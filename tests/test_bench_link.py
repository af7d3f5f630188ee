"""Tier 1: the report and check logic of ``autocomp-bench link --scenario convergence``.

Synthetic run results stand in for the workers, so the 1% definition (accuracy points for
digits, relative validation loss for lm), the "never compressed" guard and the re-rendering
of a saved document are checked without starting any process.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from autocomp_bench import convergence, link
from autocomp_bench.report import jsonable
from autocomp_bench.worker import POWERSGD_START_ITER

STEPS = 10
NUMEL = 1000
RAW = 4 * NUMEL


def _run(
    method: str,
    valid_loss: float,
    valid_accuracy: float | None = 0.98,
    compressed_from: int | None = None,
) -> dict[str, Any]:
    """A rank-0 result as the worker writes it, plus what the parent adds."""
    result: dict[str, Any] = {
        "method": method,
        "link": "50mbit",
        "numel": NUMEL,
        "total_steps": STEPS,
        "step_times": [0.2] * STEPS,
        "train_seconds": 2.5,
        "eval_seconds": 0.5,
        "valid_loss": valid_loss,
        "median_step_s": 0.2,
        "valid_curve": [{"step": 5, "valid_loss": valid_loss + 0.1, "valid_accuracy": 0.9}],
        "bytes_per_step": float(RAW),
        "info": {},
    }
    if valid_accuracy is not None:
        result["valid_accuracy"] = valid_accuracy
    if method == "autocomp":
        start = STEPS if compressed_from is None else compressed_from
        sent = [RAW] * start + [RAW // 100] * (STEPS - start)
        result["step_times"] = [0.2] * start + [0.02] * (STEPS - start)
        result["info"] = {
            "plan": {"fc.weight": "powersgd:rank=4,ef=true", "fc.bias": "none"},
            "bytes_per_step_all": sent,
            "raw_bytes_per_step_all": [RAW] * STEPS,
        }
    elif method == "powersgd":
        result["bytes_per_step"] = RAW / 50
        result["info"] = {"compressed": ["fc.weight"]}
    return result


def _section(workload: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    section: dict[str, Any] = {
        "workload": workload,
        "workload_description": "synthetic",
        "rate": "50mbit",
        "rate_mbit": 50.0,
        "steps": STEPS,
        "autocomp_settings": "autocomp: synthetic",
        "reference_note": "reference: synthetic",
        "definition": convergence.convergence_definition(workload),
        "results": runs,
    }
    section["check"] = convergence.convergence_check(section)
    return section


def test_summary_counts_compressed_steps_and_mean_bytes() -> None:
    auto = convergence.convergence_summary(_run("autocomp", 0.1, compressed_from=4))
    assert auto["compressed_steps"] == 6
    assert auto["first_compressed_step"] == 4
    assert auto["mean_bytes_per_step"] == pytest.approx((4 * RAW + 6 * (RAW // 100)) / STEPS)
    assert auto["median_compressed_step_s"] == pytest.approx(0.02)
    assert auto["train_seconds"] == pytest.approx(2.0)  # evaluation time left out
    assert "powersgd:rank=4,ef=true: fc.weight" in auto["plan"]

    powersgd = convergence.convergence_summary(_run("powersgd", 0.1))
    assert powersgd["compressed_steps"] == STEPS - POWERSGD_START_ITER
    raw_steps = POWERSGD_START_ITER
    expected = (raw_steps * RAW + (STEPS - raw_steps) * RAW / 50) / STEPS
    assert powersgd["mean_bytes_per_step"] == pytest.approx(expected)

    reference = convergence.convergence_summary(_run("allreduce", 0.1))
    assert reference["compressed_steps"] == 0
    assert reference["mean_bytes_per_step"] == RAW


@pytest.mark.parametrize(
    ("autocomp_accuracy", "passed"),
    [(0.975, True), (0.9701, True), (0.9695, False), (0.99, True)],
)
def test_digits_gate_is_one_accuracy_point(autocomp_accuracy: float, passed: bool) -> None:
    # The loss is 50% worse in every case: for digits it is reported, not gated.
    section = _section(
        "digits",
        [
            _run("allreduce", 0.05, 0.98),
            _run("autocomp", 0.075, autocomp_accuracy, compressed_from=4),
        ],
    )
    check = section["check"]
    assert check.passed is passed, check.line()
    assert "not gated" in check.detail
    assert "compressed 6 of 10 steps" in check.detail


@pytest.mark.parametrize(("autocomp_loss", "passed"), [(2.02, True), (2.0201, False), (1.9, True)])
def test_lm_gate_is_one_percent_validation_loss(autocomp_loss: float, passed: bool) -> None:
    section = _section(
        "lm",
        [
            _run("allreduce", 2.0, None),
            _run("autocomp", autocomp_loss, None, compressed_from=4),
        ],
    )
    assert section["check"].passed is passed, section["check"].line()


def test_check_not_evaluated_without_compression_or_runs() -> None:
    never = _section("digits", [_run("allreduce", 0.05), _run("autocomp", 0.05)])
    assert never["check"].passed is None
    assert "nothing was compared" in never["check"].detail
    failed = _section(
        "digits", [{"method": "allreduce", "link": "50mbit", "error": "rank 1 exited with 1"}]
    )
    assert failed["check"].passed is None
    assert failed["check"].line().startswith("FAIL (not evaluated)")


def test_first_compression_step() -> None:
    assert convergence.first_compression_step(100, 50) == 100
    assert convergence.first_compression_step(20, 15) == 30
    assert convergence.first_compression_step(0, 5) == 5


def test_report_renders_live_and_from_saved_json() -> None:
    runs = [
        _run("allreduce", 0.05, 0.98),
        _run("powersgd", 0.06, 0.975),
        _run("autocomp", 0.055, 0.978, compressed_from=4),
        {"method": "fp16", "link": "50mbit", "error": "timed out"},
    ]
    section = _section("digits", runs)
    live = convergence.convergence_lines(section)
    # A saved document holds the check as a dict (see report.jsonable); the report must not differ.
    saved = json.loads(json.dumps(jsonable(section)))
    assert convergence.convergence_lines(saved) == live
    text = "\n".join(live)
    assert "PASS: 50mbit: autocomp within 1% of uncompressed" in text
    assert "98.00%" in text and "97.80%" in text
    assert "autocomp compressed steps 4-9 (6 steps" in text
    assert "FAILED" in text
    assert "validation accuracy after step" in text

    markdown = convergence.convergence_lines(saved, markdown=True)
    assert any(line.startswith("| method | link | steps | valid acc |") for line in markdown)
    assert markdown.count("```") == 2


def test_saved_document_rerenders_and_sets_the_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``--from-json`` does with a document holding only the convergence scenario."""
    section = _section(
        "digits", [_run("allreduce", 0.05, 0.98), _run("autocomp", 0.07, 0.95, compressed_from=4)]
    )
    document = {
        "command": "python -m autocomp_bench.link --scenario convergence",
        "code_digest": "0123456789abcdef",
        "model": "digits (see the convergence section)",
        "machine": {
            "cpu": "test CPU",
            "usable_cpus": 2,
            "torch": "2.x",
            "torch_threads_per_rank": 1,
            "backend": "gloo",
            "network": "shaped",
        },
        "runtime_s": 60.0,
        "convergence": section,
    }
    saved = json.loads(json.dumps(jsonable(document)))
    markdown = tmp_path / "out.md"
    args = argparse.Namespace(markdown=markdown, plot=None)
    assert link._write_outputs(saved, args) == 1  # 3 points below the reference: FAIL
    assert "### Convergence" in markdown.read_text(encoding="utf-8")
    link.print_report(saved)
    assert "FAIL: 50mbit: autocomp within 1% of uncompressed" in capsys.readouterr().out
