"""``autocomp-advisor report RUN_DIR``: what a past (or running) adaptive job actually did.

The run log (:mod:`autocomp.runlog`) holds one row per decision window: the link the
controller measured, step and exposed time, measured and predicted overlap, bytes on the wire,
the loss, plus every plan change, the per-layer decisions and the guard events. A summary
answers the questions people ask after a run: how fast was the link and did it change, how
much communication stayed exposed, how much did compression save, how often did the plan
change and what is it now, and did the convergence guards have to step in.

Everything is read through :class:`autocomp.runlog.RunReader`; a missing, foreign, corrupt or
other-version log is reported as a one-line error (exit 2).
"""

from __future__ import annotations

import datetime
import json
import logging
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from autocomp.advisor.units import format_bandwidth, format_bytes, format_seconds
from autocomp.runlog import RunLogError, RunReader

logger = logging.getLogger(__name__)

__all__ = ["RATE_CHANGE_FACTOR", "summarize", "summary"]

RATE_CHANGE_FACTOR = 2.0
"""Consecutive windows whose bandwidth differs by more than this are listed as rate changes."""
_PAGE = 1000
_MAX_WINDOWS = 200_000


def _stats(values: Sequence[float | None]) -> dict[str, float | None]:
    clean = [float(v) for v in values if v is not None]
    if not clean:
        return {"median": None, "min": None, "max": None, "first": None, "last": None}
    return {
        "median": statistics.median(clean),
        "min": min(clean),
        "max": max(clean),
        "first": clean[0],
        "last": clean[-1],
    }


def _all_windows(reader: RunReader) -> list[dict[str, Any]]:
    """Every retained window, oldest first, without the full records (paged)."""
    out: list[dict[str, Any]] = []
    since = -(2**62)
    while len(out) < _MAX_WINDOWS:
        page = reader.windows(since_step=since, limit=_PAGE, with_record=False)
        if not page:
            break
        out.extend(page)
        since = int(page[-1]["step"])
    return out


def summary(reader: RunReader) -> dict[str, Any]:
    """The run's summary as a JSON-friendly dict."""
    with reader.snapshot():
        meta = reader.meta()
        windows = _all_windows(reader)
        decisions = reader.decisions()
        changes = reader.changes(limit=100_000)
        guard_counts = reader.guard_counts()
        guard_events = reader.guard_events(limit=20)
    column = {key: [w.get(key) for w in windows] for key in windows[0]} if windows else {}
    ratios = [
        u / b if u is not None and b else None
        for u, b in zip(
            column.get("uncompressed_bytes_per_step", []),
            column.get("bytes_per_step", []),
            strict=True,
        )
    ]
    rate_changes = []
    previous: float | None = None
    for window in windows:
        rate = window.get("bandwidth_bytes_per_s")
        if rate and previous and max(rate / previous, previous / rate) > RATE_CHANGE_FACTOR:
            rate_changes.append(
                {"step": window["step"], "from_bytes_per_s": previous, "to_bytes_per_s": rate}
            )
        previous = rate or previous
    per_layer = Counter(change["name"] for change in changes)
    steps = [w["step"] for w in windows]
    times = [w["time"] for w in windows if w.get("time") is not None]
    return {
        "run_dir": str(reader.path.parent),
        "meta": meta,
        "windows": len(windows),
        "steps": {"first": steps[0] if steps else None, "last": steps[-1] if steps else None},
        "wall_seconds": (times[-1] - times[0]) if len(times) >= 2 else None,
        "bandwidth_bytes_per_s": _stats(column.get("bandwidth_bytes_per_s", [])),
        "latency_s": _stats(column.get("latency_s", [])),
        "step_seconds": _stats(column.get("step_seconds", [])),
        "exposed_seconds": _stats(column.get("exposed_seconds", [])),
        "measured_overlap": _stats(column.get("measured_overlap", [])),
        "predicted_overlap": _stats(column.get("predicted_overlap", [])),
        "bytes_per_step": _stats(column.get("bytes_per_step", [])),
        "uncompressed_bytes_per_step": _stats(column.get("uncompressed_bytes_per_step", [])),
        "compression_ratio": _stats(ratios),
        "loss": _stats(column.get("loss", [])),
        "rate_changes": rate_changes,
        "plan_changes": len(changes),
        "plan_changes_by_layer": dict(per_layer.most_common()),
        "current_plan": [
            {
                "name": d["name"],
                "spec": d["spec"],
                "rule": d.get("rule"),
                "reason": d.get("reason"),
                "predicted_wire_bytes": d.get("predicted_wire_bytes"),
            }
            for d in decisions
        ],
        "guard_counts": guard_counts,
        "recent_guard_events": guard_events,
    }


def _value(stats: dict[str, float | None], key: str, fmt: Any) -> str:
    value = stats.get(key)
    return "-" if value is None else fmt(value)


def render(data: dict[str, Any], console: Console) -> None:
    """The summary as rich tables."""
    meta = data["meta"]
    created = meta.get("created", "?")
    if isinstance(created, (int, float)):
        created = datetime.datetime.fromtimestamp(created, datetime.UTC).isoformat(
            timespec="seconds"
        )
    console.print(
        f"[bold]run {meta.get('run_id', '?')}[/bold] in {data['run_dir']}: "
        f"{meta.get('world_size', '?')} ranks, policy {meta.get('policy', '?')}, target overlap "
        f"{meta.get('target_overlap', '?')}, window {meta.get('window', '?')} steps, "
        f"{len(meta.get('layers') or [])} layers, created {created}"
    )
    if not data["windows"]:
        console.print("no decision window logged yet")
        return
    wall = data["wall_seconds"]
    console.print(
        f"{data['windows']} windows, steps {data['steps']['first']}..{data['steps']['last']}"
        + (f", {format_seconds(wall)} of wall time" if wall else "")
    )
    table = Table(title="Measured per window", box=box.SIMPLE_HEAVY)
    for name in ("quantity", "median", "min", "max", "first", "last"):
        table.add_column(name, justify="left" if name == "quantity" else "right")
    rows = (
        ("bandwidth", "bandwidth_bytes_per_s", format_bandwidth),
        ("latency per hop", "latency_s", format_seconds),
        ("step time", "step_seconds", format_seconds),
        ("exposed comm", "exposed_seconds", format_seconds),
        ("measured overlap", "measured_overlap", lambda v: f"{v:.0%}"),
        ("predicted overlap", "predicted_overlap", lambda v: f"{v:.0%}"),
        ("wire bytes/step", "bytes_per_step", format_bytes),
        ("compression ratio", "compression_ratio", lambda v: f"{v:.1f}x"),
        ("loss", "loss", lambda v: f"{v:.4g}"),
    )
    for label, key, fmt in rows:
        stats = data[key]
        columns = ("median", "min", "max", "first", "last")
        table.add_row(label, *(_value(stats, k, fmt) for k in columns))
    console.print(table)
    if data["rate_changes"]:
        text = "; ".join(
            f"step {c['step']}: {format_bandwidth(c['from_bytes_per_s'])} -> "
            f"{format_bandwidth(c['to_bytes_per_s'])}"
            for c in data["rate_changes"][:10]
        )
        console.print(f"link rate changes (>{RATE_CHANGE_FACTOR:g}x): {text}")
    else:
        console.print("link rate: no change by more than 2x between windows")
    busiest = ", ".join(
        f"{name} ({count})" for name, count in list(data["plan_changes_by_layer"].items())[:5]
    )
    console.print(
        f"plan changes: {data['plan_changes']}" + (f"; most switched: {busiest}" if busiest else "")
    )
    if data["current_plan"]:
        plan = Table(title="Current plan (latest decision)", box=box.SIMPLE)
        plan.add_column("layer")
        plan.add_column("spec")
        plan.add_column("rule")
        plan.add_column("reason", overflow="fold")
        for row in data["current_plan"]:
            plan.add_row(row["name"], row["spec"], row["rule"] or "", (row["reason"] or "")[:120])
        console.print(plan)
    counts = data["guard_counts"]
    if counts:
        console.print("guards: " + ", ".join(f"{guard} {count}" for guard, count in counts.items()))
        for event in data["recent_guard_events"][-5:]:
            layer = f" {event['layer']}" if event.get("layer") else ""
            console.print(
                f"  step {event['step']}: {event['guard']}{layer}: {event['detail']} "
                f"-> {event['action']}"
            )
    else:
        console.print("guards: none triggered")


def summarize(run_dir: Path, console: Console, *, json_path: Path | None = None) -> int:
    """The ``report`` command: 0 on success, 2 for an unusable run directory."""
    try:
        with RunReader(run_dir) as reader:
            data = summary(reader)
    except RunLogError as err:
        print(f"autocomp-advisor: error: {err}", file=sys.stderr)
        return 2
    render(data, console)
    if json_path is not None:
        json_path.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    return 0
