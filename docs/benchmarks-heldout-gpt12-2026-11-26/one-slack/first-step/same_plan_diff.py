# Scratch (not in the package); see docs/benchmarks.md, "Held-out 12-layer GPT: one slack".
"""Scratch: per-step gradient norms and parameter checksums of static and adaptive autocomp,
both pinned to rank 4 with warmup_steps=2, 2 gloo ranks on loopback (bit-identical for 160
steps on seed 1: the adaptive path sends what the static one sends).

    mkdir -p /tmp/gd && PYTHONPATH=docs/benchmarks-heldout-gpt12-2026-11-26 \
        .venv/bin/python same_plan_diff.py 160 1
"""
import datetime, json, sys, tempfile, gc
from pathlib import Path
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 120
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 1

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
    if mode == "static":
        ctl = autocomp.wrap(ddp, plan={"*": "powersgd:rank=4"}, warmup_steps=2)
    else:
        ctl = autocomp.wrap(ddp, plan={"*": "powersgd:rank=4"}, target_overlap=0.9, warmup_steps=2)
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
    ctl.close()
    names = [n for n, _ in model.named_parameters()]
    return out, names

def main(rank, store, res):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=300))
    try:
        r = {}
        for mode in ("static", "adaptive"):
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
    names = r["names"]
    for a, b in zip(r["static"], r["adaptive"]):
        diff = [n for n, x, y in zip(names, a["g"], b["g"]) if x != y]
        print(a["step"], "loss %.5f %.5f" % (a["loss"], b["loss"]), "params equal" if a["sum"] == b["sum"] else "params DIFFER", len(diff), diff[:4])
        if a["sum"] != b["sum"] and a["step"] > 5 and len(diff) > 0:
            pass
