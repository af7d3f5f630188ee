"""Report pieces the multi-rank benchmarks share: checks, tables, and JSON-safe documents.

A benchmark prints a plain-text report as it goes and can write the same numbers as markdown
(for docs/benchmarks.md) and JSON (to re-render later); these helpers keep the three in step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "MB",
    "Check",
    "check_from_dict",
    "jsonable",
    "markdown_table",
    "other_share",
    "plain_table",
    "plan_summary",
]

MB = 1e6
"""Bytes per MB in every report (decimal)."""


@dataclass(slots=True)
class Check:
    """One PASS/FAIL line of a benchmark's targets."""

    name: str
    passed: bool | None
    """None: could not be evaluated (a run failed or was not part of this invocation)."""
    detail: str

    def line(self) -> str:
        status = {True: "PASS", False: "FAIL", None: "FAIL (not evaluated)"}[self.passed]
        return f"{status}: {self.name}: {self.detail}"


def check_from_dict(saved: dict[str, Any]) -> Check:
    """A check as :func:`jsonable` saved it, back as a :class:`Check`."""
    return Check(saved["name"], saved["passed"], saved["detail"])


def jsonable(value: Any) -> Any:
    """``value`` with every :class:`Check` turned into a dict (its line included)."""
    if isinstance(value, Check):
        return {
            "name": value.name,
            "passed": value.passed,
            "detail": value.detail,
            "line": value.line(),
        }
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def plain_table(columns: Sequence[str], rows: list[list[str]], left: int = 1) -> list[str]:
    """Aligned text: the first ``left`` columns left-aligned (labels), the others right-aligned
    (numbers)."""
    table = [list(columns), *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    out = []
    for n, row in enumerate(table):
        cells = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def markdown_table(columns: Sequence[str], rows: list[list[str]], left: int = 1) -> list[str]:
    """A markdown table, aligned as :func:`plain_table`."""
    out = ["| " + " | ".join(columns) + " |"]
    out.append("|" + "|".join("---" if i < left else "---:" for i in range(len(columns))) + "|")
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def plan_summary(plan: dict[str, str]) -> str:
    """``spec: name, name; spec: name``: a per-layer plan grouped by compressor."""
    groups: dict[str, list[str]] = {}
    for name, spec in plan.items():
        groups.setdefault(spec, []).append(name)
    return "; ".join(f"{spec}: {', '.join(names)}" for spec, names in groups.items())


def other_share(result: dict[str, Any]) -> str:
    """Share of the machine's CPUs busy with anything but this run (other jobs, softirq)."""
    share = result.get("other_cpu_share")
    return "n/a" if share is None else f"{share:.0%}"
