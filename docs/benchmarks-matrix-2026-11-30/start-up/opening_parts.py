"""The opening's parts timed on rank 0: probe growth (time_all_reduce calls), contention,
half sums, on one tta task over loopback (2 gloo ranks). PYTHONPATH=. python opening_parts.py TASK ROUNDS"""
import collections, datetime, sys, tempfile, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp, autocomp.opening as op
from autocomp_bench.overhead import _workload
T = collections.defaultdict(float); N = collections.Counter()
def timed(name, f):
    def g(*a, **k):
        s = time.perf_counter(); r = f(*a, **k); T[name] += time.perf_counter() - s; N[name] += 1; return r
    return g
for name in ("time_all_reduce", "contention", "half_sums", "opening"):
    setattr(op.ProbeRunner, name, timed(name, getattr(op.ProbeRunner, name)))
import autocomp.planner as pl
pl.WindowPlanner.open = timed("planner.open", pl.WindowPlanner.open)
def main(rank, world, store, task, rounds):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    for r in range(rounds):
        torch.manual_seed(0)
        model, make_opt, batch, loss_fn = _workload(task)
        ddp = DDP(model); ctl = autocomp.wrap(ddp, target_overlap=0.9); opt = make_opt(ddp.parameters())
        T.clear(); N.clear()
        for step in range(2):
            x, y = batch(rank, step)
            loss = loss_fn(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
        if rank == 0:
            print(f"round {r}: opening_seconds {ctl.adaptive.opening_seconds:.3f}; " + ", ".join(f"{k} {v:.3f} s x{N[k]}" for k, v in T.items()))
        ctl.close()
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(main, args=(2, tempfile.mktemp(), sys.argv[1], int(sys.argv[2])), nprocs=2)
