"""Scratch check (not in the package): the stability test's bound over many noise seeds.

    .venv/bin/python docs/benchmarks-heldout-gpt12-2026-11-26/one-slack/stability_seeds.py 40

Replays ``tests/data/windows_gpt_50mbit.jsonl`` exactly as ``tests/test_stability.py`` does
(no noise, then seeds 0..N-1 of +-30% error and +-15% timing noise) and prints how many seeds
break the at-most-one-change-in-5-windows bound, and the total of counted changes.
"""

import itertools
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import test_stability as ts  # noqa: E402


def main(seeds: int) -> None:
    broken, changes = [], 0
    for seed in [None, *range(seeds)]:
        plans, forced, released = ts._replay(None if seed is None else random.Random(seed))
        exempt = [a | b for a, b in zip(forced, released, strict=True)]
        for windows in ts._changes(plans, exempt).values():
            changes += len(windows)
            if any(b - a < ts.SPAN for a, b in itertools.pairwise(windows)):
                broken.append(seed)
    print(f"{len(set(broken))} of {seeds + 1} seeds break the bound {sorted(set(broken), key=str)}")
    print(f"{changes} counted changes in all")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
