"""Time the opening's parts on 2 loopback gloo ranks for a tta task."""
import datetime, sys, tempfile, time, functools
from pathlib import Path
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
from autocomp import opening as op

def timed(cls, name, acc):
    orig = getattr(cls, name)
    @functools.wraps(orig)
    def f(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            acc.append((name, round(time.perf_counter() - t, 4)))
    setattr(cls, name, f)

def main(rank, store, task):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
    acc = []
    for n in ("opening", "contention", "half_sums", "time_all_reduce"):
        timed(op.ProbeRunner, n, acc)
    from autocomp_bench.tasks import build_task
    spec = build_task(task)
    torch.manual_seed(0)
    ddp = DDP(spec.build_model())
    t = time.perf_counter()
    ctl = autocomp.wrap(ddp, target_overlap=0.9)
    wrap_s = time.perf_counter() - t
    opt = spec.make_optimizer(ddp.parameters())
    for step in range(3):
        x, y = spec.batch(rank, step, 0)
        t = time.perf_counter()
        loss = spec.loss(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
        if rank == 0: print("step", step, round(time.perf_counter() - t, 3), flush=True)
    if rank == 0:
        print("wrap", round(wrap_s, 3), "opening_seconds", round(ctl.adaptive.opening_seconds, 3))
        print(acc)
    ctl.close()
    dist.destroy_process_group()

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(main, args=(str(Path(tmp) / "s"), sys.argv[1]), nprocs=2, start_method="spawn")
