"""The time-to-accuracy benchmark's arithmetic: per-run summaries, the oracle, the checks.

Pure functions of the runs' results (no processes), so they are tested on synthetic numbers
and re-run on a saved document. Definitions:

* **median step**: the median training seconds per step after the first
  :data:`SKIP_STEPS` steps (start-up, first DDP bucket rebuild, cold caches);
* **penalty removed**: ``(t_allreduce - t_method) / (t_allreduce - t_limit)``, the share of
  the communication penalty (plain all-reduce's step over the compute-only limit's) the
  method takes away; None when that penalty is not positive;
* **oracle**: for a (task, rate), the static grid plan with the best final validation metric
  there (the task's metric: accuracy for classifiers, else loss), each grid plan run on its
  own: what a user who tried every plan of the grid would have picked in hindsight.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any

from autocomp_bench.report import Check

logger = logging.getLogger(__name__)

__all__ = [
    "METHODS",
    "PEERS",
    "Cell",
    "choose_oracle",
    "penalty_fraction",
    "summarize_run",
    "tta_checks",
    "tta_rows",
]

METHODS: tuple[str, ...] = ("allreduce", "fp16", "powersgd", "limit", "adaptive", "oracle")
PEERS: tuple[str, ...] = ("allreduce", "fp16", "powersgd")
SKIP_STEPS = 3
LOSS_MARGIN = 0.02
"""Validation loss adaptive may be above the oracle (and unshaped, above all-reduce)."""
PENALTY_TARGET = 0.95
PENALTY_TASK = "gpt"
PENALTY_RATE_MBIT = 50.0
UNSHAPED_FACTOR = 1.03


@dataclass(frozen=True, slots=True)
class Cell:
    """One (task, rate) of the benchmark."""

    task: str
    rate: str
    rate_mbit: float | None
    higher_is_better: bool = False
    """The task's metric is validation accuracy (else validation loss)."""


def median_step(step_times: list[float]) -> float | None:
    """Median seconds per step after the first :data:`SKIP_STEPS` (all of them if too few)."""
    if not step_times:
        return None
    measured = step_times[SKIP_STEPS:] or step_times
    return statistics.median(measured)


def summarize_run(result: dict[str, Any]) -> dict[str, Any]:
    """The numbers a report needs from one worker result, without its per-step lists.

    A 60 s run of a small model takes thousands of steps: keeping every step time of every
    run would make the saved document tens of megabytes.
    """
    if "error" in result:
        return {
            k: result.get(k)
            for k in ("error", "wall_seconds", "log_tail", "other_cpu_share", "load_after")
        }
    final = result["curve"][-1]
    return {
        "steps": result["steps"],
        "rank1_steps": len(result["rank1_step_times"]),
        "median_step_s": median_step(result["step_times"]),
        "train_seconds": result["train_seconds"],
        "eval_seconds": result["eval_seconds"],
        "valid_loss": final["valid_loss"],
        "valid_accuracy": final.get("valid_accuracy"),
        "bytes_per_step": result["bytes_per_step"],
        "numel": result["numel"],
        "curve": result["curve"],
        "info": result.get("info") or {},
        "wall_seconds": result["wall_seconds"],
        "other_cpu_share": result.get("other_cpu_share"),
        "load_after": result.get("load_after"),
    }


def succeeded(run: dict[str, Any] | None) -> bool:
    return run is not None and "error" not in run and run.get("median_step_s") is not None


def penalty_fraction(
    t_allreduce: float | None, t_method: float | None, t_limit: float | None
) -> float | None:
    """Share of all-reduce's communication penalty over the limit that a method removes."""
    if t_allreduce is None or t_method is None or t_limit is None:
        return None
    penalty = t_allreduce - t_limit
    if not penalty > 0:
        return None
    return (t_allreduce - t_method) / penalty


def _metric_key(run: dict[str, Any], higher_is_better: bool) -> tuple[float, float]:
    """Sort key: best first (metric, then validation loss as the tie-break)."""
    loss = run["valid_loss"]
    if higher_is_better:
        accuracy = run.get("valid_accuracy")
        return (-(accuracy if accuracy is not None else -math.inf), loss)
    return (loss, loss)


def choose_oracle(
    grid_runs: dict[str, dict[str, Any]], higher_is_better: bool
) -> tuple[str, dict[str, Any]] | None:
    """(grid plan name, its run) with the best final metric; None if every grid run failed.

    Ties keep the grid's order (``grid_runs`` is ordered as the grid).
    """
    ok = [(name, run) for name, run in grid_runs.items() if succeeded(run)]
    if not ok:
        return None
    return min(ok, key=lambda item: _metric_key(item[1], higher_is_better))


def tta_rows(
    runs: list[dict[str, Any]], cells: list[Cell], methods: list[str]
) -> list[dict[str, Any]]:
    """One row per (task, rate, method): the run's summary, penalty removed, oracle choice.

    ``runs`` are summaries tagged with ``task``, ``rate``, ``method`` and, for the oracle's
    grid runs, ``grid`` (the plan's name).
    """
    rows = []
    for cell in cells:
        here = [r for r in runs if r["task"] == cell.task and r["rate"] == cell.rate]
        by_method = {r["method"]: r for r in here if r["method"] != "oracle"}
        grid = {r["grid"]: r for r in here if r["method"] == "oracle"}
        chosen = choose_oracle(grid, cell.higher_is_better) if grid else None
        base = by_method.get("allreduce")
        limit = by_method.get("limit")
        t_base = base["median_step_s"] if succeeded(base) else None
        t_limit = limit["median_step_s"] if succeeded(limit) else None
        for method in methods:
            if method == "oracle":
                if not grid:
                    continue
                if chosen is None:
                    run: dict[str, Any] = {"error": "every grid plan failed"}
                else:
                    run = {**chosen[1], "oracle_choice": chosen[0]}
            elif method in by_method:
                run = by_method[method]
            else:
                continue
            row = {
                "task": cell.task,
                "rate": cell.rate,
                "rate_mbit": cell.rate_mbit,
                "method": method,
                **{k: v for k, v in run.items() if k not in ("task", "rate", "method")},
            }
            if succeeded(run):
                row["penalty_removed"] = penalty_fraction(t_base, run["median_step_s"], t_limit)
            rows.append(row)
    return rows


def _row(rows: list[dict[str, Any]], cell: Cell, method: str) -> dict[str, Any] | None:
    for row in rows:
        if row["task"] == cell.task and row["rate"] == cell.rate and row["method"] == method:
            return row
    return None


def tta_checks(rows: list[dict[str, Any]], cells: list[Cell]) -> list[Check]:
    """The project's targets for adaptive, as PASS/FAIL lines (see the module docstring)."""
    checks = []
    for cell in cells:
        where = f"{cell.task} @ {cell.rate}"
        auto = _row(rows, cell, "adaptive")
        peers = [r for m in PEERS if succeeded(r := _row(rows, cell, m))]
        name = f"{where}: adaptive valid loss <= best peer's"
        if not succeeded(auto) or not peers:
            checks.append(Check(name, None, "adaptive or every peer failed / missing"))
        else:
            assert auto is not None
            best = min(peers, key=lambda r: r["valid_loss"])
            missing = [m for m in PEERS if not succeeded(_row(rows, cell, m))]
            checks.append(
                Check(
                    name,
                    auto["valid_loss"] <= best["valid_loss"],
                    f"adaptive {auto['valid_loss']:.4f} vs {best['method']} "
                    f"{best['valid_loss']:.4f}"
                    + (f" (peers missing: {', '.join(missing)})" if missing else ""),
                )
            )
        oracle = _row(rows, cell, "oracle")
        name = f"{where}: adaptive valid loss <= oracle's + {LOSS_MARGIN:g}"
        if not (succeeded(auto) and succeeded(oracle)):
            checks.append(Check(name, None, "adaptive or the oracle failed / missing"))
        else:
            assert auto is not None and oracle is not None
            checks.append(
                Check(
                    name,
                    auto["valid_loss"] <= oracle["valid_loss"] + LOSS_MARGIN,
                    f"adaptive {auto['valid_loss']:.4f} vs oracle ({oracle['oracle_choice']}) "
                    f"{oracle['valid_loss']:.4f}",
                )
            )
    for cell in cells:
        if (
            cell.task == PENALTY_TASK
            and cell.rate_mbit is not None
            and math.isclose(cell.rate_mbit, PENALTY_RATE_MBIT)
        ):
            checks.append(_penalty_check(rows, cell))
    for cell in cells:
        if cell.rate_mbit is None:
            checks += _unshaped_checks(rows, cell)
    return checks


def _penalty_check(rows: list[dict[str, Any]], cell: Cell) -> Check:
    name = f"{cell.task} @ {cell.rate}: adaptive removes >= {PENALTY_TARGET:.0%} of the penalty"
    auto = _row(rows, cell, "adaptive")
    if not succeeded(auto) or auto is None or auto.get("penalty_removed") is None:
        return Check(name, None, "adaptive, allreduce or limit failed / missing, or no penalty")
    removed = auto["penalty_removed"]
    base, limit = _row(rows, cell, "allreduce"), _row(rows, cell, "limit")
    assert base is not None and limit is not None
    return Check(
        name,
        removed >= PENALTY_TARGET,
        f"{removed:.1%} (allreduce {base['median_step_s']:.3f} s, adaptive "
        f"{auto['median_step_s']:.3f} s, limit {limit['median_step_s']:.3f} s per step)",
    )


def _unshaped_checks(rows: list[dict[str, Any]], cell: Cell) -> list[Check]:
    where = f"{cell.task} @ {cell.rate}"
    step_name = f"{where}: adaptive median step <= {UNSHAPED_FACTOR} x allreduce's"
    loss_name = f"{where}: adaptive valid loss <= allreduce's + {LOSS_MARGIN:g}"
    auto, base = _row(rows, cell, "adaptive"), _row(rows, cell, "allreduce")
    if not (succeeded(auto) and succeeded(base)):
        why = "adaptive or allreduce failed / missing"
        return [Check(step_name, None, why), Check(loss_name, None, why)]
    assert auto is not None and base is not None
    ratio = auto["median_step_s"] / base["median_step_s"]
    return [
        Check(
            step_name,
            ratio <= UNSHAPED_FACTOR,
            f"adaptive {auto['median_step_s']:.4f} s / allreduce {base['median_step_s']:.4f} s "
            f"= {ratio:.3f}x",
        ),
        Check(
            loss_name,
            auto["valid_loss"] <= base["valid_loss"] + LOSS_MARGIN,
            f"adaptive {auto['valid_loss']:.4f} vs allreduce {base['valid_loss']:.4f}",
        ),
    ]
