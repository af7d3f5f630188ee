# Scratch check of the unshaped mlp-lm overhead (docs/benchmarks.md, "Full run at `6ffda81`"):
# python benchmarks-tta-6ffda81-overhead.py ddp|autocomp 600  (NORUNLOG=1, PROF=1, MALLOC_* env)
"""mlp-lm on loopback, 2 gloo ranks: plain DDP vs autocomp.wrap (plan ends up 'none'), cProfile rank 0."""
import cProfile, os, pstats, sys, time, io
import torch, torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def run(rank, world, mode, store_path, steps, out):
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    import autocomp
    from autocomp_bench.tasks import build_task
    task = build_task("mlp-lm")
    torch.manual_seed(0)
    model = task.build_model()
    ddp = DDP(model, init_sync=False)
    ctl = None
    if mode == "autocomp":
        ctl = autocomp.wrap(ddp, target_overlap=0.9, **({"run_dir": False} if os.environ.get("NORUNLOG") else {}))
    opt = task.make_optimizer(ddp.parameters())
    times = []
    prof = cProfile.Profile()
    for step in range(steps):
        if step == 100 and rank == 0 and os.environ.get("PROF"): prof.enable()
        t0 = time.perf_counter()
        x, y = task.batch(rank, step, 0)
        loss = task.loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if ctl is not None: ctl.observe_loss(loss.item())
        else: loss.item()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        prof.disable()
        s = io.StringIO()
        if os.environ.get("PROF"):
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        times = sorted(times[100:])
        with open(out, "w") as f:
            from collections import Counter
            extra = ""
            if ctl is not None:
                extra = f" plan {dict(Counter(ctl.plan.values()))} decisions {len(ctl.history)} p90 {times[int(len(times)*0.9)]*1e3:.1f}"
            f.write(f"{mode} median {times[len(times)//2]*1e3:.2f} ms p10 {times[len(times)//10]*1e3:.2f} mean {sum(times)/len(times)*1e3:.2f}{extra}\n" + s.getvalue())
    if ctl is not None: ctl.close()
    dist.destroy_process_group()

if __name__ == "__main__":
    mode, steps = sys.argv[1], int(sys.argv[2])
    import tempfile
    where = tempfile.mkdtemp(prefix="autocomp-overhead-")
    mp.spawn(run, args=(2, mode, f"{where}/store", steps, f"{where}/{mode}.txt"), nprocs=2)
    print(open(f"{where}/{mode}.txt").read())
