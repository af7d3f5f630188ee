"""Replay a recorded adaptive run (``AUTOCOMP_RECORD_WINDOWS``) through a fresh planner, as
rank 0's, and print every decision up to a step: the recorded solver and plan, then the
replayed ones. The planner is calibrated anew here (``replay_idle_link.build``), so its
compression-time priors carry this machine's calibration noise, not the run's: near-ties
can fall either way from one replay to the next.

    .venv/bin/python docs/benchmarks-slack-climb-2026-11-29/replay_decisions.py \\
        docs/benchmarks-slack-climb-2026-11-29/windows-gpt-1gbit-2ffd606-s0.jsonl 118
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks-idle-link-baseline-2026-11-29"))
from replay_idle_link import open_recording, replay_up_to


def _short(plan: list[str] | tuple[str, ...]) -> str:
    counts = Counter(spec.split(":")[0] for spec in plan)
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items()))


def main(path: str, upto: int) -> None:
    for line, m, update in replay_up_to(*open_recording(path), upto):
        recorded = line["decision"]
        print(
            f"step {m.step}: recorded {recorded['solver']} "
            f"({_short([d['spec'] for d in recorded['layers']])}); "
            f"replayed {update.record.decision['solver']} ({_short(update.plan)})"
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
