"""Replay a recorded adaptive run (``AUTOCOMP_RECORD_WINDOWS``) through a fresh planner, as
rank 0's, and print every decision up to a step: the recorded solver and plan, then the
replayed ones. The planner is calibrated anew here (``replay_idle_link.build``), so its
compression-time priors carry this machine's calibration noise, not the run's: near-ties
can fall either way from one replay to the next.

    .venv/bin/python docs/benchmarks-slack-climb-2026-11-29/replay_decisions.py \\
        docs/benchmarks-slack-climb-2026-11-29/windows-gpt-1gbit-2ffd606-s0.jsonl 118
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks-idle-link-baseline-2026-11-29"))
from replay_idle_link import apply_opening, build

from autocomp.window import WindowMeasurement


def _short(plan: list[str] | tuple[str, ...]) -> str:
    counts = Counter(spec.split(":")[0] for spec in plan)
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items()))


def main(path: str, upto: int) -> None:
    with open(path) as recording:
        lines = [json.loads(text) for text in recording]
    first = lines[1]
    names = list(first["current"])
    world = first["measurement"]["world_size"]
    planner = build(names, first["shapes"], world)
    model = planner.cost_model
    apply_opening(planner, lines)
    for line in lines[1:]:
        m = WindowMeasurement.from_dict(line["measurement"])
        if m.step > upto:
            break
        if "contention_seconds_per_byte" in line:
            model.update_contention(line["contention_seconds_per_byte"])
        update = planner.decide(m, dict(line["current"]))
        recorded = line["decision"]
        print(
            f"step {m.step}: recorded {recorded['solver']} "
            f"({_short([d['spec'] for d in recorded['layers']])}); "
            f"replayed {update.record.decision['solver']} ({_short(update.plan)})"
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
