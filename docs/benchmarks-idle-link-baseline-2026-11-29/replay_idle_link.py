"""Replay a recorded adaptive run (``AUTOCOMP_RECORD_WINDOWS``) through two fresh planners,
one pricing every reading as the meter gives it (before autocomp/policy/idle_link.py) and
one with the idle-link pricing, and print where their decisions differ.

Both planners are built as ``AdaptiveLoop`` builds rank 0's (default policy,
``autocomp.wrap(ddp, target_overlap=0.9)``) and share one calibration (the second copies the
first's cost model), so near-ties cannot fall apart on two calibrations' noise. ``REPRICED``
marks a window whose decision the idle-link pricing moved to another link reading. Each is fed the
recorded measurements and the plans that ran, so only the decision at the first boundary
where they differ is a true counterfactual: after it the recording ran the old plan.

    .venv/bin/python docs/benchmarks-idle-link-baseline-2026-11-29/replay_idle_link.py windows-*.jsonl
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import replace

import torch

from autocomp.opening import HALF_DTYPES, calibrate
from autocomp.planner import PlanUpdate, WindowPlanner
from autocomp.policy import load_policy
from autocomp.policy.idle_link import IdleLink
from autocomp.window import WindowMeasurement


def build(
    names: list[str], shapes: dict[str, list[int]], world: int, calibrated: bool = True
) -> WindowPlanner:
    rules = load_policy("default")
    config = replace(
        WindowPlanner.Config(),
        target_overlap=0.9,
        window=rules.replan_interval,
        warmup_steps=rules.warmup_steps,
    )
    planner = WindowPlanner(
        rules,
        names,
        {n: torch.Size(shapes[n]) for n in names},
        dict.fromkeys(names, torch.float32),
        [],
        config,
        world_size=world,
    )
    if calibrated:
        calibrate(planner.cost_model, rules.candidates, world, torch.device("cpu"))
    return planner


def apply_opening(planner: WindowPlanner, lines: list[dict]) -> None:
    """Feed a recording's opening line (``lines[0]``) to ``planner`` as rank 0 took it:
    the contention and half-sum readings, the embedding row shares, the opening decision."""
    opening, first = lines[0]["opening"], lines[1]
    world = first["measurement"]["world_size"]
    planner.cost_model.update_contention(opening["contention_seconds_per_byte"])
    for dtype, cost in zip(HALF_DTYPES, opening["half_sum_seconds_per_element"], strict=True):
        planner.cost_model.update_half_sum(dtype, cost)
    planner.row_shares = dict(opening.get("row_shares", {}))
    planner.open(tuple(opening["probe"]), opening["forward_seconds"], world, first["current"])


def open_recording(path: str) -> tuple[WindowPlanner, list[dict]]:
    """A recording's lines and rank 0's planner for it (``build``), opened as rank 0 was
    (``apply_opening``)."""
    with open(path) as recording:
        lines = [json.loads(text) for text in recording]
    first = lines[1]
    planner = build(list(first["current"]), first["shapes"], first["measurement"]["world_size"])
    apply_opening(planner, lines)
    return planner, lines


def replay_up_to(
    planner: WindowPlanner, lines: list[dict], upto: int
) -> Iterator[tuple[dict, WindowMeasurement, PlanUpdate]]:
    """Feed ``planner`` the recorded windows up to step ``upto``, each with the contention
    re-read it carried; yields (recorded line, measurement, replayed update)."""
    for line in lines[1:]:
        m = WindowMeasurement.from_dict(line["measurement"])
        if m.step > upto:
            return
        if "contention_seconds_per_byte" in line:
            planner.cost_model.update_contention(line["contention_seconds_per_byte"])
        yield line, m, planner.decide(m, dict(line["current"]))


def compressed_of(decision: dict) -> dict[str, str]:
    return {d["name"]: d["spec"] for d in decision["layers"] if d["spec"] != "none"}


def replay(path: str) -> None:
    lines = [json.loads(text) for text in open(path)]
    first = lines[1]
    names = list(first["current"])
    world = first["measurement"]["world_size"]
    planners = {"meter": build(names, first["shapes"], world)}
    planners["idle"] = build(names, first["shapes"], world, calibrated=False)
    planners["idle"].cost_model.load_state_dict(planners["meter"].cost_model.state_dict())
    # The "meter" planner never replaces a reading: its idle-link pricing is switched off.
    planners["meter"].idle_link.priced = (  # type: ignore[method-assign]
        lambda window, estimate, **_: estimate
    )
    for planner in planners.values():
        apply_opening(planner, lines)
    print(f"== {path}")
    for line in lines[1:]:
        m = WindowMeasurement.from_dict(line["measurement"])
        if "contention_seconds_per_byte" in line:
            for planner in planners.values():
                planner.cost_model.update_contention(line["contention_seconds_per_byte"])
        out = {k: p.decide(m, dict(line["current"])) for k, p in planners.items()}
        decided = {k: u.record.decision for k, u in out.items()}
        plans = {k: compressed_of(d) for k, d in decided.items()}
        bw = {k: d["bandwidth_bytes_per_s"] / 1e6 for k, d in decided.items()}
        mark = "DIFFERS" if plans["meter"] != plans["idle"] else ""
        if bw["meter"] != bw["idle"]:
            mark += " REPRICED"
        print(
            f"step {m.step:4d} ran {compressed_of({'layers': [{'name': n, 'spec': s} for n, s in line['current'].items()]})}"
        )
        print(f"   meter-priced {bw['meter']:7.0f} MB/s -> {plans['meter']}")
        print(f"   idle-priced  {bw['idle']:7.0f} MB/s -> {plans['idle']} {mark}")
        print(f"   recorded     {line['decision']['bandwidth_bytes_per_s'] / 1e6:7.0f} MB/s -> {compressed_of(line['decision'])}")


if __name__ == "__main__":
    assert IdleLink  # the module under test
    for arg in sys.argv[1:]:
        replay(arg)
