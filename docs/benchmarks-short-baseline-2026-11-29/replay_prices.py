"""Replay a recorded adaptive run (``AUTOCOMP_RECORD_WINDOWS``) through a fresh planner up to
a step, and print what its cost model holds: each measured group's median hook time against
its calibrated prior, the interim scale carried to options not measured yet, and the
predicted hook time of fp16 and PowerSGD on the MLP LM's two large matrices.

The planner is built as rank 0's (``replay_idle_link.py`` of the thirty-third session) and
calibrated anew here, so its priors carry this machine's calibration noise, not the run's.

    .venv/bin/python docs/benchmarks-short-baseline-2026-11-29/replay_prices.py \\
        docs/benchmarks-short-baseline-2026-11-29/windows-mlp-lm-1gbit-557c14b-s1.jsonl 150
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks-idle-link-baseline-2026-11-29"))
from replay_idle_link import open_recording, replay_up_to


def main(path: str, upto: int) -> None:
    planner, lines = open_recording(path)
    first = lines[1]
    world = first["measurement"]["world_size"]
    model = planner.cost_model
    step = 0
    for _, m, _ in replay_up_to(planner, lines, upto):
        step = m.step
    print(f"{path}: after step {step}, interim scale {model._interim_scale(world):.2f}")
    for key, group in model._groups.items():
        spec, shape, w = key
        prior = model._prior(model._compressor(spec), torch.Size(shape), w, model._shares.get(key, 1.0))
        measured = statistics.median(group)
        print(f"  measured {spec} {shape}: {measured * 1e3:.2f} ms, prior {prior * 1e3:.3f} ({measured / prior:.1f}x)")
    for name in ("fc1.weight", "fc2.weight"):
        shape = torch.Size(first["shapes"][name])
        for spec in ("fp16:ef=false", "powersgd:rank=4,ef=true"):
            predicted = model.compress_seconds(spec, shape)
            prior = model._prior(model._compressor(spec), shape, world)
            print(f"  {name} {spec}: predicted {predicted * 1e3:.2f} ms (prior {prior * 1e3:.2f})")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
