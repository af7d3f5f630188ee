"""2 gloo ranks on loopback: PyTorch's fp16 hook, autocomp static fp16, and autocomp adaptive with
the plan pinned to fp16 (with observe_loss every step, as tta runs it), stepped in turn."""
import sys, tempfile, statistics, time, json
from pathlib import Path
sys.path.insert(0, "/work/main")
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tests.multirank import run_ranks

TASK = sys.argv[1] if len(sys.argv) > 1 else "digits-resnet"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 400

def body(rank, world, task, steps):
    import autocomp
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from autocomp_bench.tasks import build_task
    torch.set_num_threads(1)
    spec = build_task(task)
    def make(mode):
        torch.manual_seed(0); model = spec.build_model(); ddp = DDP(model); ctl = None
        if mode == "hook": ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif mode == "static": ctl = autocomp.wrap(ddp, plan={"*": "fp16:ef=false"})
        elif mode == "adaptive": ctl = autocomp.wrap(ddp, target_overlap=0.9, plan={"*": "fp16:ef=false"})
        elif mode == "adaptive-free": ctl = autocomp.wrap(ddp, target_overlap=0.9)
        return model, ddp, spec.make_optimizer(ddp.parameters()), ctl
    modes = ["ddp", "hook", "static", "adaptive"]
    built = {m: make(m) for m in modes}
    times = {m: [] for m in modes}
    for step in range(steps):
        for m in (modes if step % 2 else modes[::-1]):
            model, ddp, opt, ctl = built[m]
            x, y = spec.batch(rank, step, world)
            dist.barrier()
            t0 = time.perf_counter()
            loss = spec.loss(ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
            if ctl is not None and m.startswith("adaptive"): ctl.observe_loss(loss.detach())
            times[m].append(time.perf_counter() - t0)
    out = {m: statistics.median(times[m][20:]) * 1e3 for m in modes}
    out.update({f"{m}/hook": statistics.median(a / b for a, b in zip(times[m][20:], times["hook"][20:])) for m in modes})
    return out

if __name__ == "__main__":
    res = run_ranks(body, 2, Path(tempfile.mkdtemp()), TASK, STEPS, timeout=1200)
    for r in res: print(json.dumps({k: round(v, 4) for k, v in r.items()}))
