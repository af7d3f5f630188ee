"""Where does cnn's unshaped step go? limit (no comm) vs a 1-element all-reduce per bucket vs full all-reduce."""
import os, time, statistics, warnings, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
warnings.filterwarnings("ignore")

def noop(state, bucket):
    f = torch.futures.Future(); f.set_result(bucket.buffer()); return f
def tiny(state, bucket):
    t = torch.zeros(1)
    return dist.all_reduce(t, async_op=True).get_future().then(lambda _: bucket.buffer())
def full(state, bucket):
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

def run(rank, path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=rank, world_size=2)
    from autocomp_bench.tasks import build_task
    task = build_task("cnn")
    res = {}
    for rnd in range(3):
        for name, hook in (("limit", noop), ("tiny", tiny), ("full", full)):
            torch.manual_seed(0)
            model = task.build_model()
            ddp = DDP(model); ddp.register_comm_hook(None, hook)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            x = torch.randn(64, 1, 8, 8); y = torch.randint(0, 10, (64,))
            ts = []
            for step in range(150):
                s = time.perf_counter()
                loss = torch.nn.functional.cross_entropy(ddp(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
                ts.append(time.perf_counter() - s)
            res.setdefault(name, []).append(statistics.median(ts[20:]) * 1e3)
            dist.barrier()
    if rank == 0:
        print({k: [round(v, 2) for v in vs] for k, vs in res.items()}, sum(p.numel() for p in model.parameters()))
    dist.destroy_process_group()

if __name__ == "__main__":
    p = "/tmp/rs/skewstore"
    if os.path.exists(p): os.remove(p)
    mp.spawn(run, args=(p,), nprocs=2)
