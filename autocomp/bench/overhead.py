"""What autocomp's machinery costs when it compresses nothing: hook and profiler overhead.

Two local gloo ranks (loopback) train the 16.5M-parameter byte-level LM three ways, with the
same seed and batches, interleaved round by round so machine load hits all alike:

- ``ddp``: plain DDP, PyTorch's built-in all-reduce;
- ``static``: ``autocomp.wrap(ddp, plan={"*": "none"})``, the unified hook with no profiler;
- ``adaptive``: ``autocomp.wrap(ddp, target_overlap=0.9, plan={"*": "none"})``, everything
  pinned uncompressed, so the profiler, sampled norms and the per-window collectives and
  decision run while the bytes stay identical.

``adaptive / static`` is the profiling overhead (target <= 2% of step time); ``static / ddp``
is the cost of routing gradients through a Python comm hook at all.

    python -m autocomp.bench.overhead --steps 60 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from autocomp.workloads import MLPLanguageModel, text_batch, text_split

logger = logging.getLogger(__name__)

MODES = ("ddp", "static", "adaptive")


def _run_mode(mode: str, rank: int, steps: int, window: int) -> list[float]:
    torch.manual_seed(0)
    model = MLPLanguageModel(hidden=3072)
    ddp = DDP(model)
    if mode == "static":
        autocomp.wrap(ddp, plan={"*": "none"})
    elif mode == "adaptive":
        autocomp.wrap(ddp, plan={"*": "none"}, target_overlap=0.9, window=window, warmup_steps=0)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    split = text_split()
    times = []
    for step in range(steps):
        x, y = text_batch(split.train, model.context, 64, rank, step)
        start = time.perf_counter()
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return times[2:]  # first steps include DDP's bucket rebuild and lazy initialization


def _rank_main(
    rank: int, world: int, store: str, steps: int, window: int, rounds: int, out: str
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, world),
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    try:
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(rounds):
            for mode in MODES:
                times[mode].extend(_run_mode(mode, rank, steps, window))
        if rank == 0:
            Path(out).write_text(json.dumps(times))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="steps per mode and round")
    parser.add_argument("--window", type=int, default=20, help="adaptive window")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args(argv)
    if args.steps < 5 or args.rounds < 1 or args.window < 1:
        parser.error("need --steps >= 5, --rounds >= 1, --window >= 1")
    with tempfile.TemporaryDirectory(prefix="autocomp-overhead-") as tmp:
        out = Path(tmp) / "times.json"
        mp.start_processes(
            _rank_main,
            args=(2, str(Path(tmp) / "store"), args.steps, args.window, args.rounds, str(out)),
            nprocs=2,
            start_method="spawn",
        )
        times = json.loads(out.read_text())
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    result: dict[str, Any] = {
        "steps_per_mode": {mode: len(values) for mode, values in times.items()},
        "median_step_s": medians,
        "hook_overhead": medians["static"] / medians["ddp"] - 1.0,
        "profiling_overhead": medians["adaptive"] / medians["static"] - 1.0,
        "torch": torch.__version__,
    }
    print("autocomp overhead on loopback, 2 gloo ranks, 16.5M-parameter LM, nothing compressed")
    for mode in MODES:
        print(f"  {mode:<9} median {medians[mode] * 1e3:8.1f} ms/step ({len(times[mode])} steps)")
    print(f"  comm hook vs built-in all-reduce: {result['hook_overhead']:+.1%}")
    print(f"  profiler + window loop (target <= 2%): {result['profiling_overhead']:+.1%}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
