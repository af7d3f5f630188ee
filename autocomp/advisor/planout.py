"""Turning the advice into files the training job loads: a plan and a warm-start cost model.

The plan is an :mod:`autocomp.plan` JSON file with one exact-name rule per parameter, so
``autocomp.wrap(ddp, plan="plan.json")`` applies it as a static plan and reading it shows what
every layer gets. Names are escaped for fnmatch (``[``, ``*`` and ``?`` are literal).

The cost model (``plan.cost.json``, :meth:`autocomp.cost_model.CostModel.save` format) holds
the compression costs measured by the profile, at the profiled and at the what-if world size,
and no link estimate (the job measures its own). An adaptive job starts from it with::

    ctl = autocomp.wrap(ddp, target_overlap=0.9)
    saved = CostModel.load("plan.cost.json")
    ctl.adaptive.cost_model.load_state_dict(saved.state_dict())
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from autocomp.compressors import build_compressor
from autocomp.cost_model import CostModel
from autocomp.plan import Plan, Rule

logger = logging.getLogger(__name__)

__all__ = ["cost_path_for", "escape_glob", "plan_for", "write_plan"]


def escape_glob(name: str) -> str:
    """A glob matching exactly ``name`` (fnmatch metacharacters in brackets)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def plan_for(assignment: Mapping[str, str]) -> Plan:
    """One rule per parameter, in the given order; default ``none``."""
    rules = tuple(
        Rule(escape_glob(name), build_compressor(spec)) for name, spec in assignment.items()
    )
    return Plan(rules, build_compressor("none"))


def cost_path_for(plan_path: Path) -> Path:
    """``plan.json`` -> ``plan.cost.json`` (same directory)."""
    stem = plan_path.name.removesuffix(".json")
    return plan_path.with_name(f"{stem}.cost.json")


def write_plan(plan: Plan, plan_path: Path, costs: CostModel, cost_path: Path) -> None:
    """Write both files; the cost model is saved without a link estimate."""
    plan.save(plan_path)
    link = costs.link if costs.bandwidth_bytes_per_s is not None else None
    costs.update_link(None)
    try:
        costs.save(cost_path)
    finally:
        costs.update_link(link)
