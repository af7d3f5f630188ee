"""Rank 0's and rank 1's time inside the boundary, by part (scratch)."""
import argparse, collections, functools, statistics, sys, time, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paired import run_ranks_on_shaped_link

def worker(args):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    import autocomp.adaptive as A, autocomp.planner as P, autocomp.profiler as PR, autocomp.window as W
    acc = collections.defaultdict(list)
    def timed(owner, name, label):
        f = getattr(owner, name)
        @functools.wraps(f)
        def w(*a, **k):
            t = time.perf_counter()
            try: return f(*a, **k)
            finally: acc[label].append(time.perf_counter() - t)
        setattr(owner, name, w)
    timed(A.AdaptiveLoop, "_boundary", "boundary")
    timed(P.WindowPlanner, "decide", "planner.decide")
    timed(A.AdaptiveLoop, "_broadcast", "broadcast")
    timed(A.AdaptiveLoop, "_apply", "apply")
    timed(A.AdaptiveLoop, "_remember", "remember")
    timed(A.AdaptiveLoop, "_measurement", "measurement")
    timed(A.AdaptiveLoop, "_sketched", "sketched")
    timed(A.AdaptiveLoop, "_reread_contention", "reread_contention")
    timed(PR.StepProfiler, "end_window", "end_window")
    timed(A, "combine_link_busy", "combine_link_busy")
    timed(A, "record_window_line", "record_window_line")
    orig_ar = A.dist.all_reduce
    from autocomp_bench.tasks import build_task
    from autocomp_bench.worker import attach
    task = build_task(args.task)
    torch.manual_seed(1)
    att = attach("adaptive", task.build_model(), {"adaptive_kwargs": {"target_overlap": 0.9}})
    timed(type(att.ctl.adaptive._vector), "pack", "pack")
    if att.ctl.adaptive.runlog is not None:
        timed(type(att.ctl.adaptive.runlog), "append_window", "runlog.append")
    opt = task.make_optimizer(att.ddp.parameters())
    rank = dist.get_rank()
    for step in range(args.steps):
        x, y = task.batch(rank, step, 1)
        loss = task.loss(att.ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    for r in range(2):
        dist.barrier()
        if r == rank:
            print(f"rank {rank}: medians over boundaries (ms), count")
            for k, v in acc.items():
                print(f"  {k:20s} {statistics.median(v)*1e3:8.2f}  n={len(v)}  total {sum(v):.3f} s")
            sys.stdout.flush()
    att.ctl.close()
    dist.destroy_process_group()

p = argparse.ArgumentParser()
p.add_argument("--task", default="cnn"); p.add_argument("--rate", type=float, default=200)
p.add_argument("--steps", type=int, default=1200); p.add_argument("--worker", action="store_true")
a = p.parse_args()
if a.worker: worker(a)
else: run_ranks_on_shaped_link(__file__, a.rate, port=29617, timeout_s=900)
