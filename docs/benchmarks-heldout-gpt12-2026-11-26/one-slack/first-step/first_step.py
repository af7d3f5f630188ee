# Scratch (not in the package); see docs/benchmarks.md, "Held-out 12-layer GPT: one slack".
"""Scratch: static rank 4 on every parameter, first compressed step from the mode name
(static1: step 1, static2: step 2), 2 gloo ranks on loopback, validation loss every 40 steps.

    mkdir -p /tmp/gd && PYTHONPATH=docs/benchmarks-heldout-gpt12-2026-11-26 \
        .venv/bin/python first_step.py 280 1 static1,static2
"""
import datetime, json, sys, tempfile, gc
from pathlib import Path
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 120
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 1
MODES = sys.argv[3].split(",")

def checksum(model):
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
        w = torch.arange(1, flat.numel() + 1, dtype=torch.float64).remainder_(997)
        return [float(flat.sum()), float((flat * w).sum())]

def grads(model):
    return [float(p.grad.double().norm()) if p.grad is not None else 0.0 for p in model.parameters()]

def train(mode, rank):
    import autocomp
    from autocomp_bench.tasks import build_task
    task = build_task("gpt-deep")
    torch.manual_seed(SEED)
    model = task.build_model()
    ddp = DDP(model, init_sync=False)
    ctl = autocomp.wrap(ddp, plan={"*": "powersgd:rank=4"}, warmup_steps=int(mode[-1]))
    opt = task.make_optimizer(ddp.parameters())
    out = []
    for step in range(STEPS):
        x, y = task.batch(rank, step, SEED)
        loss = task.loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        g = grads(model)
        opt.step()
        out.append({"step": step, "loss": float(loss.detach()), "sum": checksum(model), "g": g})
        if (step + 1) % 40 == 0:
            out[-1]["valid"] = task.evaluate(model)["valid_loss"]
    ctl.close()
    names = [n for n, _ in model.named_parameters()]
    return out, names

def main(rank, store, res):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=300))
    try:
        r = {}
        for mode in MODES:
            r[mode], names = train(mode, rank)
            gc.collect()
        if rank == 0:
            r["names"] = names
            Path(res).write_text(json.dumps(r))
    finally:
        gc.collect()
        dist.destroy_process_group()

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        res = "/tmp/gd/res.json"
        mp.start_processes(main, args=(str(Path(tmp) / "store"), res), nprocs=2, start_method="spawn")
    r = json.load(open("/tmp/gd/res.json"))
    for mode in MODES:
        print(mode, " ".join(f"{o['step']+1}:{o['valid']:.4f}" for o in r[mode] if "valid" in o))
