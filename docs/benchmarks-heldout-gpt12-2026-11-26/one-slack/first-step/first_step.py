# Scratch (not in the package); see docs/benchmarks.md, "Held-out 12-layer GPT: one slack".
"""Same plan, different paths: 2 gloo ranks on loopback, every parameter on PowerSGD rank 4.

A mode is ``staticN`` (``wrap(plan=...)``) or ``adaptiveN`` (the same plan as pins with
``target_overlap=0.9``), N the warm-up steps (the first compressed step). Prints, for the
first two modes, the first step whose parameters differ, and every mode's validation loss
each 40 steps.

    mkdir -p /tmp/gd && PYTHONPATH=docs/benchmarks-heldout-gpt12-2026-11-26 \\
        .venv/bin/python first_step.py 160 1 static2,adaptive2   # bit-identical
    ... first_step.py 280 1 static1,static2                      # the start step alone
"""

import datetime
import gc
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 120
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 1
MODES = (sys.argv[3] if len(sys.argv) > 3 else "static1,static2").split(",")
RESULT = "/tmp/gd/res.json"


def checksum(model: torch.nn.Module) -> list[float]:
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64).remainder_(997)
        return [float(flat.sum()), float((flat * weights).sum())]


def train(mode: str, rank: int) -> list[dict]:
    import autocomp
    from autocomp_bench.tasks import build_task

    task = build_task("gpt-deep")
    torch.manual_seed(SEED)
    model = task.build_model()
    ddp = DDP(model, init_sync=False)
    warmup = int(mode[-1])
    extra = {"target_overlap": 0.9} if mode.startswith("adaptive") else {}
    ctl = autocomp.wrap(ddp, plan={"*": "powersgd:rank=4"}, warmup_steps=warmup, **extra)
    optimizer = task.make_optimizer(ddp.parameters())
    out = []
    for step in range(STEPS):
        x, y = task.batch(rank, step, SEED)
        loss = task.loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        row = {"step": step + 1, "loss": float(loss.detach()), "sum": checksum(model)}
        if (step + 1) % 40 == 0:
            row["valid"] = task.evaluate(model)["valid_loss"]
        out.append(row)
    ctl.close()
    return out


def rank_main(rank: int, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, 2),
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=300),
    )
    try:
        results = {}
        for mode in MODES:
            results[mode] = train(mode, rank)
            gc.collect()
        if rank == 0:
            Path(RESULT).write_text(json.dumps(results))
    finally:
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(rank_main, args=(str(Path(tmp) / "store"),), nprocs=2, start_method="spawn")
    results = json.loads(Path(RESULT).read_text())
    a, b = results[MODES[0]], results[MODES[1]]
    differ = next((x["step"] for x, y in zip(a, b) if x["sum"] != y["sum"]), None)
    print(f"{MODES[0]} and {MODES[1]}: parameters", "identical" if differ is None else f"differ from step {differ}")
    for mode in MODES:
        print(mode, " ".join(f"{r['step']}:{r['valid']:.4f}" for r in results[mode] if "valid" in r))
