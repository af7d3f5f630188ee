import cProfile, pstats, datetime, sys, tempfile, time, io
from pathlib import Path
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp

def main(rank, store, task, mode, steps):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
    from autocomp_bench.tasks import build_task
    spec = build_task(task)
    torch.manual_seed(0)
    ddp = DDP(spec.build_model())
    ctl = autocomp.wrap(ddp, target_overlap=0.9) if mode == "free" else None
    opt = spec.make_optimizer(ddp.parameters())
    prof = cProfile.Profile()
    times = []
    for step in range(steps):
        x, y = spec.batch(rank, step, 0)
        if step == 60 and rank == 0: prof.enable()
        t = time.perf_counter()
        loss = spec.loss(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
        if ctl is not None: ctl.observe_loss(float(loss.item()))
        times.append(time.perf_counter() - t)
    if rank == 0:
        prof.disable()
        import statistics
        print(mode, "median ms", round(statistics.median(times[60:]) * 1e3, 1))
        s = io.StringIO(); ps = pstats.Stats(prof, stream=s).sort_stats("cumtime"); ps.print_stats("autocomp/", 40); ps.print_callers("named_modules"); print(s.getvalue()[:6000])
    if ctl: ctl.close()
    dist.destroy_process_group()

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(main, args=(str(Path(tmp) / "s"), sys.argv[1], sys.argv[2], int(sys.argv[3])), nprocs=2, start_method="spawn")
