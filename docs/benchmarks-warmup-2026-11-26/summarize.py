"""Summarize the A/B's autocomp-bench JSONs into one small file: per run, the arm, round,
method, steps, median step, final metric, bytes per step and the decision trail's specs."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def main(out: str, paths: list[str]) -> None:
    runs = []
    for path in sorted(paths):
        # <label>-<round>[-<rates>]: the label may hold dashes, the round is the first number.
        parts = Path(path).stem.split("-")
        at = next(i for i, part in enumerate(parts) if part.isdigit())
        label, round_ = "-".join(parts[:at]), parts[at]
        for row in json.loads(Path(path).read_text())["rows"]:
            info = row.get("info") or {}
            trail = [
                {
                    "step": t["step"],
                    "solver": t["solver"],
                    "measured_step_s": t.get("measured_step_s"),
                    "compute_step_s": t.get("compute_step_s"),
                    "specs": dict(Counter(v[0] for v in t["layers"].values())),
                }
                for t in info.get("trail") or []
            ]
            runs.append(
                {
                    "arm": label,
                    "round": int(round_),
                    **{
                        k: row.get(k)
                        for k in (
                            "method",
                            "task",
                            "link",
                            "rate",
                            "steps",
                            "median_step_s",
                            "valid_loss",
                            "final_metric",
                            "link_bytes_per_step",
                        )
                        if k in row
                    },
                    "trail": trail,
                }
            )
    Path(out).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
