"""The time-to-accuracy benchmark's report: text tables, a markdown section, the curve plot.

Everything here renders a saved document (``autocomp-bench tta --json``) as well as a live
one, so ``--from-json`` re-renders a run without training anything.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from autocomp_bench.report import (
    MB,
    check_from_dict,
    markdown_table,
    other_share,
    plain_table,
    plan_summary,
)
from autocomp_bench.tta_analysis import METHODS, SKIP_STEPS, Cell, succeeded

logger = logging.getLogger(__name__)

__all__ = ["cell_lines", "plot_curves", "render_markdown", "text_report"]

COLUMNS = (
    "method",
    "steps",
    "median s/step",
    "valid loss",
    "valid acc",
    "MB/step",
    "penalty removed",
    "other CPU",
    "note",
)


def _cells(document: dict[str, Any]) -> list[Cell]:
    return [Cell(**cell) for cell in document["cells"]]


def _note(row: dict[str, Any]) -> str:
    per_seed = row.get("per_seed")
    seeds = (
        "per seed " + " / ".join(f"{s['valid_loss']:.4f} ({s['steps']})" for s in per_seed)
        if per_seed
        else ""
    )
    return "; ".join(part for part in (_run_note(row), seeds) if part)


def _run_note(row: dict[str, Any]) -> str:
    info = row.get("info") or {}
    if row["steps"] != row.get("rank1_steps"):  # the harness guarantees equal counts
        if row.get("per_seed"):
            return "RANK 1 RAN OTHER STEP COUNTS ON A SEED"
        return f"RANK 1 RAN {row.get('rank1_steps')} STEPS"
    if row.get("oracle_choice") is not None:
        return f"grid plan {row['oracle_choice']}"
    if row["method"] == "adaptive" and "decisions" in info:
        first = info.get("first_decision_step")
        return f"{info['decisions']} decisions" + ("" if first is None else f", first @{first}")
    return ""


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def cell_rows(rows: list[dict[str, Any]], cell: Cell) -> list[list[str]]:
    out = []
    for row in rows:
        if row["task"] != cell.task or row["rate"] != cell.rate:
            continue
        if not succeeded(row):
            out.append([row["method"], "FAILED", *["-"] * 6, str(row.get("error", ""))])
            continue
        accuracy = row.get("valid_accuracy")
        bytes_per_step = row.get("bytes_per_step")
        out.append(
            [
                row["method"],
                str(row["steps"]),
                f"{row['median_step_s']:.4f}",
                f"{row['valid_loss']:.4f}",
                "-" if accuracy is None else f"{accuracy:.2%}",
                "-" if bytes_per_step is None else f"{bytes_per_step / MB:.3f}",
                _fmt(row.get("penalty_removed"), ".1%"),
                other_share(row),
                _note(row),
            ]
        )
    return out


def _plan_lines(rows: list[dict[str, Any]], cell: Cell) -> list[str]:
    lines = []
    for row in rows:
        if row["task"] != cell.task or row["rate"] != cell.rate or not succeeded(row):
            continue
        plan = (row.get("info") or {}).get("plan")
        if plan and row["method"] in ("adaptive", "oracle"):
            lines.append(f"{row['method']} final plan: {compact_plan(plan)}")
    return lines


def compact_plan(plan: dict[str, str], names: int = 4) -> str:
    """:func:`~autocomp_bench.report.plan_summary`, with long name lists cut to a count."""
    groups: dict[str, list[str]] = {}
    for name, spec in plan.items():
        groups.setdefault(spec, []).append(name)
    parts = []
    for spec, members in groups.items():
        shown = ", ".join(members[:names])
        more = len(members) - names
        parts.append(f"{spec}: {shown}" + (f" and {more} more" if more > 0 else ""))
    return "; ".join(parts)


def cell_lines(document: dict[str, Any], cell: Cell, markdown: bool = False) -> list[str]:
    """The table of one (task, rate), with the final plans of adaptive and the oracle."""
    rows = cell_rows(document["rows"], cell)
    table = markdown_table(COLUMNS, rows) if markdown else plain_table(COLUMNS, rows)
    plans = _plan_lines(document["rows"], cell)
    if markdown:
        return [*table, *(["", "```", *plans, "```"] if plans else [])]
    return [f"{cell.task} @ {cell.rate}:", *table, *plans]


def _definitions(document: dict[str, Any]) -> list[str]:
    s = document["settings"]
    grid = "; ".join(f"{name} = {plan_summary(plan)}" for name, plan in s["oracle_grid"].items())
    kwargs = "".join(f", {k}={v!r}" for k, v in s["adaptive_kwargs"].items())
    seeds = s.get("seeds") or [s["seed"]]  # documents before --seeds hold one "seed"
    seeded = (
        f"seed {seeds[0]}"
        if len(seeds) == 1
        else f"each of seeds {', '.join(map(str, seeds))} (the table gives the mean final "
        "metric over the seeds, the median steps and median step time)"
    )
    return [
        f"Every method trains a fresh model of each task from {seeded} for "
        f"{s['budget_s']:g} s of training (evaluation excluded, clock paused), 2 gloo ranks, "
        f"{s['threads']} torch thread(s) per rank; both ranks agree on the clock after every "
        f"step (all-reduce MAX), so they stop at the same step. Validation at {s['evals']} "
        "evenly spaced points and at the end; the table gives the final one.",
        "Methods: allreduce = plain DDP; fp16 = PyTorch's fp16_compress_hook; powersgd = "
        "PyTorch's powerSGD_hook (rank 4, error feedback, warm start, start_powerSGD_iter=2, "
        "one bucket); limit = a hook that sends nothing (compute only); adaptive = "
        f"autocomp.wrap(ddp{kwargs}) with ctl.observe_loss every step; "
        "oracle = the grid plan with the best final validation metric for that task and rate "
        f"(autocomp.wrap(ddp, plan=..., warmup_steps=2); grid: {grid}).",
        f"median s/step: after the first {SKIP_STEPS} steps. MB/step: mean bytes one rank "
        "sent per step over the run (MB = 10^6). penalty removed = (t_allreduce - t_method) / "
        "(t_allreduce - t_limit) on median steps.",
    ]


def _machine_line(document: dict[str, Any]) -> str:
    m = document["machine"]
    source = f" (from {document['code_source']})" if document.get("code_source") else ""
    return (
        f"Machine: {m['cpu']}, {m['usable_cpus']} usable CPUs, torch {m['torch']} (CPU), "
        f"{m['torch_threads_per_rank']} thread(s) per rank, {m['backend']}, {m['network']}. "
        f"Code {document.get('code_digest')}{source}. Total runtime "
        f"{document['runtime_s'] / 60:.1f} min."
    )


def _checks(document: dict[str, Any]) -> list[str]:
    return [check_from_dict(c).line() for c in document["checks"]]


def text_report(document: dict[str, Any]) -> list[str]:
    """The plain-text report (what a live run prints at its end)."""
    out = [f"report of: {document['command']}", _machine_line(document)]
    for cell in _cells(document):
        out += ["", *cell_lines(document, cell)]
    return [*out, "", "checks:", *_checks(document)]


def render_markdown(document: dict[str, Any]) -> str:
    """A section for docs/benchmarks.md: command, settings, one table per (task, rate)."""
    tasks = document.get("task_descriptions", {})
    out = [
        "## Time to accuracy (`autocomp-bench tta`)",
        "",
        f"Command: `{document['command']}`",
        "",
        _machine_line(document),
        "",
        *_definitions(document),
        "",
        "Tasks:",
        "",
        *(f"- `{name}`: {text}" for name, text in tasks.items()),
        "",
    ]
    for cell in _cells(document):
        out += [f"### {cell.task} @ {cell.rate}", "", *cell_lines(document, cell, True), ""]
    out += ["Checks:", "", "```", *_checks(document), "```", ""]
    return "\n".join(out)


def plot_curves(document: dict[str, Any], path: Path) -> None:
    """Validation loss against training seconds: one panel per (task, rate), a line a method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = _cells(document)
    tasks = list(dict.fromkeys(c.task for c in cells))
    rates = list(dict.fromkeys(c.rate for c in cells))
    fig, axes = plt.subplots(
        len(tasks),
        len(rates),
        figsize=(max(3.6 * len(rates), 7.2), 2.8 * len(tasks) + 0.6),
        squeeze=False,
        sharex=True,
    )
    for cell in cells:
        ax = axes[tasks.index(cell.task)][rates.index(cell.rate)]
        title = f"{cell.task} @ {cell.rate}"
        for row in document["rows"]:
            if row["task"] != cell.task or row["rate"] != cell.rate or not succeeded(row):
                continue
            curve = row["curve"]
            if row.get("oracle_choice") is not None:
                title += f" (oracle: {row['oracle_choice']})"
            ax.plot(
                [p["train_seconds"] for p in curve],
                [p["valid_loss"] for p in curve],
                marker=".",
                linewidth=1.2,
                label=row["method"],
                color=f"C{METHODS.index(row['method'])}",  # one colour per method everywhere
            )
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("training seconds", fontsize=8)
    for row_axes in axes:
        row_axes[0].set_ylabel("validation loss", fontsize=8)
    legend: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=6, fontsize=8)
    fig.tight_layout(rect=(0, 0.6 / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
