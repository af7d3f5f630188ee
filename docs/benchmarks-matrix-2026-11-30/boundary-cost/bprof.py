"""Where a window boundary's time goes: adaptive autocomp (target_overlap=0.9) on TASK over a
tbf-shaped link of RATE_MBIT, STEPS steps, every phase of AdaptiveLoop._boundary timed on rank 0
(monkeypatched wrappers), plus the sampled steps' extra time.
    python bprof.py TASK RATE_MBIT STEPS
"""
import collections, datetime, json, os, statistics, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(task, steps):
    import autocomp
    import autocomp.adaptive as A
    import autocomp.opening as O
    from autocomp_bench.tasks import build_task
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    acc = collections.defaultdict(list)

    def timed(owner, name, label):
        orig = getattr(owner, name)
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                acc[label].append(time.perf_counter() - t)
        setattr(owner, name, wrapper)

    timed(A.AdaptiveLoop, "_boundary", "boundary")
    timed(A.AdaptiveLoop, "_broadcast", "broadcast")
    timed(A.AdaptiveLoop, "_apply", "apply")
    timed(A.AdaptiveLoop, "_reread_contention", "reread_contention")
    timed(A.AdaptiveLoop, "_agree_warmup_end", "agree_warmup")
    timed(A, "combine_link_busy", "combine_busy")
    timed(O.ProbeRunner, "fastest_all_reduce", "probe")
    import autocomp.planner as P
    timed(P.WindowPlanner, "decide", "decide")
    timed(A.AdaptiveLoop, "_measurement", "measurement")
    timed(A.AdaptiveLoop, "_sketched", "sketched")
    timed(A.AdaptiveLoop, "_peer_record", "peer_record")
    import autocomp.profiler as PR
    timed(PR.Profiler if hasattr(PR, "Profiler") else PR.StepProfiler, "end_window", "end_window")
    import cProfile
    prof = cProfile.Profile()
    orig_decide = P.WindowPlanner.decide
    def pdecide(*a, **k):
        prof.enable()
        try:
            return orig_decide(*a, **k)
        finally:
            prof.disable()
    P.WindowPlanner.decide = pdecide
    orig_ar = dist.all_reduce
    spec = build_task(task)
    torch.manual_seed(0)
    ddp = DDP(spec.build_model())
    ctl = autocomp.wrap(ddp, target_overlap=0.9)
    loop = ctl.adaptive
    opt = spec.make_optimizer(ddp.parameters())
    times, sampled = [], []
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = spec.batch(rank, step, 0)
        t = time.perf_counter()
        loss = spec.loss(ddp(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        times.append(time.perf_counter() - t)
        sampled.append(bool(loop.profiler.sample_this_step))
    total = time.perf_counter() - t0
    bsec, osec = loop.boundary_seconds, loop.opening_seconds
    plan = {n: s.compressor.spec for n, s in loop.state.slots.items()}
    ctl.close()
    if rank == 0:
        med = statistics.median(times[20:])
        samp = [t for t, s in zip(times[20:], sampled[20:]) if s]
        uns = [t for t, s in zip(times[20:], sampled[20:]) if not s]
        print(json.dumps({"steps": steps, "total_s": total, "median_step_s": med,
            "mean_step_s": total / steps, "boundary_s": bsec, "opening_s": osec,
            "sampled_steps": len(samp), "sampled_median_s": statistics.median(samp) if samp else None,
            "unsampled_median_s": statistics.median(uns),
            "phases": {k: {"n": len(v), "sum_s": sum(v), "median_ms": 1e3 * statistics.median(v), "max_ms": 1e3 * max(v)} for k, v in acc.items()},
            "plan": plan}, indent=1))
    if rank == 0:
        import pstats
        prof.dump_stats("/tmp/s44/bprof/decide.prof")
    dist.destroy_process_group()


if __name__ == "__main__":
    if os.environ.get("BPROF_WORKER"):
        worker(sys.argv[1], int(sys.argv[3]))
        sys.exit(0)
    from autocomp_bench.shaped_link import ShapedLink
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=float(sys.argv[2]))) as link:
        procs = [link.popen(h, [sys.executable, *sys.argv],
                            env={**link.rank_env(h, world_size=2, master_port=29541), "BPROF_WORKER": "1"})
                 for h in range(2)]
        rc = [p.wait(timeout=900) for p in procs]
        print("exit codes", rc)
