"""Time WindowPlanner.decide on a synthetic many-layer model (no processes).

Blocks of a 256x256 weight and its bias in 8 DDP buckets, 2 ranks, the default policy;
eight windows, each deciding from the last one's plan. Usage:

    python decide_bench.py                 # medians at 200, 400 and 800 parameters, 50 Mbit/s
    python decide_bench.py --plans OUT     # every decision's plan at 4 rates, as JSON (A/B)
    python decide_bench.py --profile 400   # cProfile of the 400-block run
"""

from __future__ import annotations

import cProfile
import gc
import json
import pstats
import statistics
import sys
import time

import torch

from autocomp.compressors import Collective
from autocomp.planner import WindowPlanner
from autocomp.policy import load_policy
from autocomp.window import LayerWindow, WindowMeasurement

MBIT = 1e6 / 8
BUCKETS = 8


def run(blocks: int, mbit: float) -> tuple[list[float], list[list[str]]]:
    shapes = {}
    for i in range(blocks):
        shapes[f"b{i}.weight"] = torch.Size([256, 256])
        shapes[f"b{i}.bias"] = torch.Size([256])
    names = list(shapes)
    bucket_of = {n: (len(names) - 1 - i) * BUCKETS // len(names) for i, n in enumerate(names)}
    planner = WindowPlanner(
        load_policy("default"),
        names,
        shapes,
        dict.fromkeys(names, torch.float32),
        [],
        WindowPlanner.Config(window=10, warmup_steps=0),
        world_size=2,
    )
    raw = sum(s.numel() * 4 for s in shapes.values())
    comm = raw / (mbit * MBIT)
    compute = 0.2
    specs = dict.fromkeys(names, "none")
    times, plans = [], []
    for k in range(1, 9):
        layers = {
            n: LayerWindow(
                spec=specs[n],
                grad_norm=1.0,
                residual_norm=0.0,
                rel_error=None,
                hook_seconds=0.0,
                bucket=bucket_of[n],
                bucket_hideable_seconds=compute * 0.5 * bucket_of[n] / BUCKETS,
            )
            for n in names
        }
        timings = {
            "step_seconds": compute + comm,
            "backward_seconds": 0.6 * compute,
            "hideable_seconds": 0.5 * compute,
            "comm_busy_seconds": comm,
            "compress_seconds": 0.0,
            "exposed_seconds": comm,
        }
        measurement = WindowMeasurement(
            step=10 * k,
            world_size=2,
            window_steps=10,
            profiled_ranks=2,
            timings=timings,
            loss=2.0,
            layers=layers,
            busy_min=[comm] * 10,
            collectives=[[(Collective.ALL_REDUCE, raw, comm)]] * 10,
        )
        gc.collect()
        started = time.perf_counter()
        update = planner.decide(measurement, specs)
        times.append(time.perf_counter() - started)
        plans.append(list(update.plan))
        specs = dict(zip(names, update.plan, strict=True))
    return times, plans


def main(argv: list[str]) -> None:
    if argv[:1] == ["--profile"]:
        profile = cProfile.Profile()
        profile.enable()
        run(int(argv[1]), 50)
        profile.disable()
        pstats.Stats(profile).sort_stats(argv[2] if len(argv) > 2 else "tottime").print_stats(25)
    elif argv[:1] == ["--plans"]:
        out = {f"{b}-{r}": run(b, r)[1] for b in (50, 200) for r in (10, 50, 200, 2000)}
        with open(argv[1], "w") as file:
            json.dump(out, file)
    else:
        for blocks in (100, 200, 400):
            times, plans = run(blocks, 50)
            print(
                f"{2 * blocks} params: decide median {statistics.median(times) * 1e3:.1f} ms, "
                f"max {max(times) * 1e3:.1f}; last plan: {sorted(set(plans[-1]))}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
