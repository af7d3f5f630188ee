"""``make demo``: two local gloo ranks train a byte-level LM with and without autocomp.

Runs on its embedded defaults with nothing outside this machine: two processes on loopback,
the Python standard library's own source as training text. It trains the same model twice,
once with plain DDP all-reduce and once under a static autocomp plan, and prints the plan,
bytes per step, step time and validation loss of both.

Loopback is a fast link, where compression cannot pay off in time; the point here is the
bytes and the unchanged convergence. The shaped-link benchmark shows the time side.
"""

from __future__ import annotations

import argparse
import datetime
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

DEMO_PLAN = {
    "embed.*": "none",
    "*.bias": "none",
    "norm.*": "none",
    "fc*.weight": "powersgd:rank=4",
    "out.weight": "int8",
}


def _train(rank: int, use_autocomp: bool, steps: int, batch: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = MLPLanguageModel()
    ddp = DDP(model)
    ctl = autocomp.wrap(ddp, plan=DEMO_PLAN) if use_autocomp else None
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    split = text_split()
    times = []
    for step in range(steps):
        x, y = text_batch(split.train, model.context, batch, rank, step)
        start = time.perf_counter()
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    with torch.no_grad():
        x, y = text_batch(split.valid, model.context, 2048, 0, 0, seed=99)
        valid_loss = F.cross_entropy(model(x), y).item()
    raw = sum(p.numel() * p.element_size() for p in model.parameters())
    stats = ctl.stats() if ctl else None
    return {
        "median_step_s": statistics.median(times[2:]),
        "bytes_per_step": stats["bytes_sent"] / steps if stats else raw,
        "valid_loss": valid_loss,
        "plan": ctl.plan if ctl else None,
        "layers": stats["layers"] if stats else None,
    }


def _rank_main(rank: int, world_size: int, store_path: str, steps: int, batch: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store_path, world_size),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        plain = _train(rank, False, steps, batch)
        compressed = _train(rank, True, steps, batch)
        if rank == 0:
            _report(plain, compressed, steps, world_size)
    finally:
        dist.destroy_process_group()


def _report(plain: dict[str, Any], compressed: dict[str, Any], steps: int, world: int) -> None:
    print(f"\nautocomp demo: {world} gloo ranks on loopback, byte-level LM on stdlib source")
    print(f"{'layer':<14}{'shape':<16}{'compressor':<28}{'bytes/step':>12}{'raw':>12}")
    for name, layer in compressed["layers"].items():
        print(
            f"{name:<14}{'x'.join(map(str, layer['shape'])):<16}{layer['compressor']:<28}"
            f"{layer['wire_bytes_per_step']:>12,}{layer['uncompressed_bytes_per_step']:>12,}"
        )
    ratio = plain["bytes_per_step"] / compressed["bytes_per_step"]
    print(f"\nafter {steps} steps per run:")
    for label, run in (("plain DDP all-reduce", plain), ("autocomp static plan", compressed)):
        print(
            f"  {label:<22} {run['bytes_per_step'] / 1e6:8.2f} MB/step sent   "
            f"median step {run['median_step_s'] * 1e3:7.1f} ms   valid loss {run['valid_loss']:.3f}"
        )
    print(f"  bytes on the wire cut {ratio:.1f}x; loopback is fast, so time is not the point here")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args(argv)
    if args.steps < 5 or args.world_size < 1:
        parser.error("--steps must be >= 5 and --world-size >= 1")
    with tempfile.TemporaryDirectory(prefix="autocomp-demo-") as tmp:
        store = str(Path(tmp) / "store")
        mp.start_processes(
            _rank_main,
            args=(args.world_size, store, args.steps, args.batch),
            nprocs=args.world_size,
            start_method="spawn",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
