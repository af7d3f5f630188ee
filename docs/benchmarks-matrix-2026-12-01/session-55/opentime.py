"""Time the opening's parts on a shaped 2-rank link (scratch)."""
import argparse, functools, json, sys, time, collections
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from paired import run_ranks_on_shaped_link

def worker(args):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    import autocomp, autocomp.opening as O, autocomp.adaptive as A, autocomp.planner as P
    acc = collections.defaultdict(float)
    def timed(owner, name, label):
        f = getattr(owner, name)
        @functools.wraps(f)
        def w(*a, **k):
            t = time.perf_counter()
            try: return f(*a, **k)
            finally: acc[label] += time.perf_counter() - t
        setattr(owner, name, w)
    timed(O.ProbeRunner, "opening", "probe.opening(all)")
    timed(O.ProbeRunner, "contention", "  contention")
    timed(O.ProbeRunner, "half_sums", "  half_sums")
    timed(O.ProbeRunner, "time_all_reduce", "  growth passes")
    timed(P.WindowPlanner, "open", "planner.open")
    timed(O, "calibrate", "calibrate")
    timed(A.AdaptiveLoop, "_opening", "_opening total")
    timed(A.AdaptiveLoop, "_boundary", "boundaries")
    from autocomp_bench.tasks import build_task
    from autocomp_bench.worker import attach
    task = build_task(args.task)
    torch.manual_seed(1)
    model = task.build_model()
    att = attach("adaptive", model, {"adaptive_kwargs": {"target_overlap": 0.9}})
    opt = task.make_optimizer(att.ddp.parameters())
    rank = dist.get_rank()
    steps = []
    for step in range(args.steps):
        x, y = task.batch(rank, step, 1)
        t0 = time.perf_counter()
        loss = task.loss(att.ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        steps.append(time.perf_counter() - t0)
    if rank == 0:
        print("opening_seconds", att.ctl.adaptive.opening_seconds, "first steps", [round(s, 3) for s in steps[:6]])
        for k, v in acc.items(): print(f"  {k:24s} {v:.3f} s")
    att.ctl.close()
    dist.destroy_process_group()

p = argparse.ArgumentParser()
p.add_argument("--task", default="mlp-lm"); p.add_argument("--rate", type=float, default=200)
p.add_argument("--steps", type=int, default=6); p.add_argument("--worker", action="store_true")
a = p.parse_args()
if a.worker: worker(a)
else: run_ranks_on_shaped_link(__file__, a.rate, port=29613, timeout_s=600)
