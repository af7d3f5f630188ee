"""Step time, minor page faults and system time per step by mode, on loopback (2 gloo ranks).

Modes: ddp (no hook), torch_hook (PyTorch's Python all-reduce hook), fp16_hook, static
(autocomp, every tensor "none"), static_fp16 / static_bf16 (every tensor on that cast, no error
feedback), adaptive (autocomp adaptive, pinned "none"), adaptive_free (autocomp adaptive).
    ROUNDS=6 PYTHONPATH=. python static_speed.py TASK MODE,MODE,...
"""
import datetime, os, resource, statistics, sys, tempfile, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
from autocomp_bench.overhead import _workload
MODES = sys.argv[2].split(",") if len(sys.argv) > 2 else ["ddp", "torch_hook", "static", "adaptive"]
TASK = sys.argv[1] if len(sys.argv) > 1 else "ngram"
def one(mode, rank, steps=40):
    torch.manual_seed(0)
    model, make_opt, batch, loss_fn = _workload(TASK)
    ddp = DDP(model); ctl = None
    if mode == "torch_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif mode == "static":
        ctl = autocomp.wrap(ddp, plan={"*": "none"})
    elif mode == "adaptive":
        ctl = autocomp.wrap(ddp, plan={"*": "none"}, target_overlap=0.9, window=20, warmup_steps=0)
    elif mode.startswith("static_"):
        ctl = autocomp.wrap(ddp, plan={"*": mode.split("_", 1)[1] + ":ef=false"})
    elif mode == "fp16_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif mode == "bf16_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif mode == "adaptive_free":
        ctl = autocomp.wrap(ddp, target_overlap=0.9)
    opt = make_opt(ddp.parameters())
    t, f, s = [], [], []
    for step in range(steps):
        x, y = batch(rank, step)
        r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
        loss = loss_fn(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
        t1 = time.perf_counter(); r1 = resource.getrusage(resource.RUSAGE_SELF)
        t.append(t1 - t0); f.append(r1.ru_minflt - r0.ru_minflt); s.append(r1.ru_stime - r0.ru_stime)
    if ctl is not None: ctl.close()
    return t[3:], f[3:], s[3:]
def main(rank, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300))
    res = {m: ([], [], []) for m in MODES}
    for _ in range(int(os.environ.get("ROUNDS", "3"))):
        for m in MODES:
            a, b, c = one(m, rank)
            for acc, v in zip(res[m], (a, b, c)): acc.extend(v)
    if rank == 0:
        for m, (a, b, c) in res.items():
            print(f"{m:14s} step {statistics.median(a)*1e3:7.1f} ms  faults/step {statistics.median(b):8.0f}  sys {statistics.median(c)*1e3:6.1f} ms")
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(main, args=(tempfile.mktemp(),), nprocs=2)
