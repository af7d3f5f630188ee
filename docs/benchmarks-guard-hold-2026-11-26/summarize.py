"""Summarize the critical-level hold A/B: per run the final loss, steps and how often the
decision trail changed a layer's compressor; then the mean final loss per cell and code.

Usage: python summarize.py [directory of the runs' JSON files]
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path


def compressor_changes(trail: list[dict]) -> collections.Counter[str]:
    last: dict[str, str] = {}
    changes: collections.Counter[str] = collections.Counter()
    for decision in trail:
        for name, (spec, _seconds, _reason) in (decision.get("layers") or {}).items():
            if name in last and last[name] != spec:
                changes[name] += 1
            last[name] = spec
    return changes


def main() -> None:
    here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    means: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
    for path in sorted(here.glob("cnn-*.json")):
        code = path.stem.rsplit("-", 1)[1]
        for row in json.loads(path.read_text())["rows"]:
            if row["method"] != "adaptive":
                continue
            changes = compressor_changes(row["info"].get("trail", []))
            print(
                row["task"],
                row["rate"],
                row["seed"],
                code,
                f"{row['valid_loss']:.4f}",
                row["steps"],
                sum(changes.values()),
                max(changes.values(), default=0),
            )
            means[(row["task"], row["rate"], code)].append(row["valid_loss"])
    for key, losses in sorted(means.items()):
        print(*key, f"{sum(losses) / len(losses):.4f}", [round(x, 4) for x in losses])


if __name__ == "__main__":
    main()
