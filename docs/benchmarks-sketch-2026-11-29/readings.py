"""The hook's two error readings in real 2-rank gloo runs on loopback: each rank's residual
against its own input (``rel_error``) and the averaged update's error from the summed sketches
(``avg_error``, autocomp.error_sketch). One spec pinned on every matrix in adaptive mode (so
the profiler samples), window 10, seed 0. Prints, per task and spec, the L1-weighted mean e^2
of both readings over the windows from step ``--from`` on (the engine's weights: the
gradient's L1 share), and per-layer rows with ``--layers``. From the repository root:

  python docs/benchmarks-sketch-2026-11-29/readings.py --tasks gpt gpt-deep \
      --specs powersgd:rank=1 powersgd:rank=4 --steps 71 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, task_name: str, spec: str, store_path: str, out: str, steps: int) -> None:
    sys.path.insert(0, "docs/benchmarks-heldout-gpt12-2026-11-26")
    import sitecustomize  # noqa: F401  (registers gpt-deep)

    os.environ["AUTOCOMP_RECORD_WINDOWS"] = out if rank == 0 else ""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store_path, 2),
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=120),
    )
    from torch.nn.parallel import DistributedDataParallel as DDP

    import autocomp
    from autocomp_bench.tasks import build_task

    task = build_task(task_name)
    torch.manual_seed(0)
    model = task.build_model()
    ddp = DDP(model)
    ctl = autocomp.wrap(ddp, target_overlap=0.9, plan={"*": spec}, window=10, warmup_steps=2)
    opt = task.make_optimizer(ddp.parameters())
    for step in range(steps):
        x, y = task.batch(rank, step, 0)
        loss = task.loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    ctl.close()
    dist.destroy_process_group()


def summarize(path: str, start: int) -> dict:
    rows: dict[str, list[tuple[float, float, float]]] = {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines:
        record = json.loads(line)
        m = record.get("measurement")
        if not m or m["step"] < start:
            continue
        for name, layer in m["layers"].items():
            if layer["spec"] == "none" or layer["avg_error"] is None or not layer["grad_l1"]:
                continue
            rows.setdefault(name, []).append(
                (layer["grad_l1"], layer["rel_error"] ** 2, layer["avg_error"] ** 2)
            )
    layers = {
        name: {
            "l1": sum(r[0] for r in v) / len(v),
            "rank_e2": sum(r[1] for r in v) / len(v),
            "avg_e2": sum(r[2] for r in v) / len(v),
            "windows": len(v),
        }
        for name, v in rows.items()
    }
    total = sum(x["l1"] for x in layers.values()) or 1.0
    return {
        "rank_e2": sum(x["l1"] * x["rank_e2"] for x in layers.values()) / total,
        "avg_e2": sum(x["l1"] * x["avg_e2"] for x in layers.values()) / total,
        "layers": layers,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--specs", nargs="+", required=True)
    parser.add_argument("--steps", type=int, default=71)
    parser.add_argument("--from", dest="start", type=int, default=30)
    parser.add_argument("--json")
    parser.add_argument("--layers", action="store_true")
    args = parser.parse_args()
    results = {}
    for task in args.tasks:
        for spec in args.specs:
            folder = tempfile.mkdtemp()
            out = os.path.join(folder, "windows.jsonl")
            mp.spawn(
                worker,
                args=(task, spec, os.path.join(folder, "store"), out, args.steps),
                nprocs=2,
            )
            summary = summarize(out, args.start)
            results[f"{task} {spec}"] = summary
            print(
                f"{task:10s} {spec:22s} per-rank e^2 {summary['rank_e2']:.3f}  "
                f"averaged e^2 {summary['avg_e2']:.3f}",
                flush=True,
            )
            if args.layers:
                for name, x in summary["layers"].items():
                    print(
                        f"    {name:40s} l1 {x['l1']:.3g} rank {x['rank_e2']:.3f} "
                        f"avg {x['avg_e2']:.3f}"
                    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
