"""Summarize the step-gap A/B's autocomp-bench JSONs: one small JSON of every run (arm, round,
cell, loss, steps, median step, the decision trail's specs, predicted and measured steps,
the gap), and a table on stdout of the loss per round and the model's step miss per arm.

The miss is, per decision, the next window's measured step over the step the decision
predicted for the plan it chose, median over the run's decisions."""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path


def _miss(trail: list[dict]) -> float | None:
    ratios = [
        b["measured_step_s"] / a["predicted_step_s"]
        for a, b in zip(trail, trail[1:])
        if a.get("predicted_step_s") and b.get("measured_step_s")
    ]
    return statistics.median(ratios) if ratios else None


def main(out: str, paths: list[str]) -> None:
    runs = []
    for path in sorted(paths):
        label, round_ = Path(path).stem.rsplit("-", 1)
        for row in json.loads(Path(path).read_text())["runs"]:
            trail = (row.get("info") or {}).get("trail") or []
            runs.append(
                {
                    "arm": label,
                    "round": int(round_),
                    "task": row["task"],
                    "rate": row["rate"],
                    "steps": row["steps"],
                    "median_step_s": row["median_step_s"],
                    "valid_loss": row["valid_loss"],
                    "miss": _miss(trail),
                    "trail": [
                        {
                            "step": t["step"],
                            "solver": t["solver"],
                            "predicted_step_s": t.get("predicted_step_s"),
                            "measured_step_s": t.get("measured_step_s"),
                            "sync_s": t.get("sync_s"),
                            "specs": dict(Counter(v[0] for v in t["layers"].values())),
                        }
                        for t in trail
                    ],
                }
            )
    Path(out).write_text(json.dumps(runs, indent=1))
    cells: dict[tuple[str, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        cells[(run["task"], run["rate"])][run["arm"]].append(run)
    arms = sorted({run["arm"] for run in runs})
    print(
        "| cell | "
        + " | ".join(f"{a} loss (steps)" for a in arms)
        + " | "
        + " | ".join(f"{a} miss" for a in arms)
        + " |"
    )
    print("|---" * (1 + 2 * len(arms)) + "|")
    for (task, rate), by_arm in sorted(cells.items()):
        losses = [
            " / ".join(
                f"{r['valid_loss']:.4f} ({r['steps']})"
                for r in sorted(by_arm[a], key=lambda r: r["round"])
            )
            for a in arms
        ]
        misses = [
            " / ".join(
                "-" if r["miss"] is None else f"{r['miss']:.2f}"
                for r in sorted(by_arm[a], key=lambda r: r["round"])
            )
            for a in arms
        ]
        print(f"| {task} @ {rate} | " + " | ".join(losses) + " | " + " | ".join(misses) + " |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
