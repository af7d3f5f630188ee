"""Steady-state step time by mode on loopback (2 gloo ranks, one process pair): medians over
steps [SKIP, STEPS), the modes' order reversed every round. Modes: ddp, static (every tensor
"none"), pinned (adaptive pinned to "none"), free (autocomp.wrap(ddp, target_overlap=0.9)),
free_nolog (the same without a run log), torch_hook, builtin, static_nodiv, fp16_hook.
CLOCK=1 adds what the tta loop does after each step (loss.item(), an 8-byte MAX all-reduce);
RUSAGE=1 prints per-step CPU time, faults and context switches; OUTJ: every step's time.
    CLOCK=1 STEPS=800 SKIP=200 ROUNDS=6 PYTHONPATH=. python steady.py mlp-lm ddp,free
"""
import datetime, os, sys, tempfile, time, statistics
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
from autocomp_bench.overhead import _workload
TASK = sys.argv[1]; MODES = sys.argv[2].split(",")
STEPS = int(os.environ.get("STEPS", "300")); SKIP = int(os.environ.get("SKIP", "100"))
import autocomp.hook as _H
_AVG = _H.average_in_place
def one(mode, rank):
    torch.manual_seed(0)
    model, make_opt, batch, loss_fn = _workload(TASK)
    ddp = DDP(model, init_sync=False); ctl = None
    if mode == "static":
        ctl = autocomp.wrap(ddp, plan={"*": "none"})
    elif mode == "torch_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif mode == "builtin":
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    elif mode == "static_nodiv":
        import autocomp.hook as H
        H.average_in_place = lambda b, w: None
        ctl = autocomp.wrap(ddp, plan={"*": "none"})
    elif mode == "pinned":
        ctl = autocomp.wrap(ddp, plan={"*": "none"}, target_overlap=0.9)
    elif mode == "free_nolog":
        ctl = autocomp.wrap(ddp, target_overlap=0.9, run_dir=False)
    elif mode == "free":
        ctl = autocomp.wrap(ddp, target_overlap=0.9)
    elif mode == "fp16_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if mode != "static_nodiv":
        import autocomp.hook as H
        H.average_in_place = _AVG
    opt = make_opt(ddp.parameters())
    ts = []
    import resource
    for step in range(STEPS):
        if step == SKIP:
            r0 = resource.getrusage(resource.RUSAGE_SELF)
        x, y = batch(rank, step)
        t0 = time.perf_counter()
        loss = loss_fn(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
        value = float(loss.item())
        if mode in ("free", "pinned"): ctl.observe_loss(value)
        if os.environ.get("CLOCK"):
            e = torch.tensor([time.perf_counter()], dtype=torch.float64); dist.all_reduce(e, op=dist.ReduceOp.MAX)
        ts.append(time.perf_counter() - t0)
    r1 = resource.getrusage(resource.RUSAGE_SELF); n = STEPS - SKIP
    if os.environ.get("RUSAGE"):
        print(f"rank {rank} {mode}: per step utime {(r1.ru_utime-r0.ru_utime)/n*1e3:.2f} ms stime {(r1.ru_stime-r0.ru_stime)/n*1e3:.2f} ms minflt {(r1.ru_minflt-r0.ru_minflt)/n:.1f} nvcsw {(r1.ru_nvcsw-r0.ru_nvcsw)/n:.1f} nivcsw {(r1.ru_nivcsw-r0.ru_nivcsw)/n:.1f}", flush=True)
    if os.environ.get("THREADS_CPU"):
        rows = []
        for t in sorted(os.listdir("/proc/self/task")):
            try:
                comm = open(f"/proc/self/task/{t}/comm").read().strip()
                f = open(f"/proc/self/task/{t}/stat").read().rsplit(")", 1)[1].split()
                rows.append((comm, (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")))
            except OSError:
                pass
        print(f"rank {rank} {mode} threads:", " ".join(f"{c}={s:.1f}" for c, s in rows if s > 0.05), flush=True)
    plan = None
    if ctl is not None:
        try: p = ctl.plan; plan = sorted(set((p() if callable(p) else p).values()))
        except Exception: plan = None
        ctl.close()
    return ts, plan
def main(rank, store):
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300))
    res = {m: [] for m in MODES}; raw = {m: [] for m in MODES}
    for r in range(int(os.environ.get("ROUNDS", "2"))):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for m in order:
            ts, plan = one(m, rank)
            res[m].append(statistics.median(ts[SKIP:])); raw[m].append(ts)
            if rank == 0: print(f"round {r} {m:10s} median {statistics.median(ts[SKIP:])*1e3:6.1f} ms  first{SKIP} mean {statistics.mean(ts[:SKIP])*1e3:6.1f} ms plan {plan}", flush=True)
    if rank == 0:
        import json; json.dump(raw, open(os.environ.get('OUTJ', 'steady.json'), 'w'))
        base = statistics.median(res[MODES[0]])
        for m in MODES:
            v = statistics.median(res[m]); print(f"{m:10s} {v*1e3:6.1f} ms  ratio {v/base:.3f}")
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(main, args=(tempfile.mktemp(),), nprocs=2)
