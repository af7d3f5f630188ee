"""Per-step wall time of adaptive on a shaped 2-rank link, each step tagged: boundary (with
or without a link probe), sampled (the steps before a boundary), other (scratch; session 56's
stepcost.py plus: the controller's parts timed on rank 0, each step's profile summary (OUT.summ:
step, compute, exposed, work, backward, controller seconds), each window's collectives
(OUT.coll), --plan JSON to pin adaptive's plan, --lat US to set the link meter's prior
latency per hop). Set AUTOCOMP_RECORD_WINDOWS to record the windows for a replay."""
import argparse, functools, json, statistics, sys, time, os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session-55"))
from paired import run_ranks_on_shaped_link

def worker(args):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    import logging; logging.basicConfig(level=logging.WARNING, format="%(message)s"); logging.getLogger("autocomp").setLevel(logging.INFO)
    import autocomp.adaptive as A
    marks = {}
    orig_b = A.AdaptiveLoop._boundary
    def boundary(self, step):
        t = time.perf_counter(); probe = self._probe_next
        try: return orig_b(self, step)
        finally: marks[step] = ("probe" if probe else "boundary", time.perf_counter() - t)
    A.AdaptiveLoop._boundary = boundary
    import autocomp.profiler as PRF
    summ = []
    orig_s = PRF.StepProfiler._summarize
    def _summ(self, st, nxt, read):
        r = orig_s(self, st, nxt, read)
        if r is not None:
            ctl = sum(read(b) - read(a) for a, b in st.controller)
            summ.append((r.step_seconds, r.compute_seconds, r.exposed_seconds, r.compress_seconds, r.backward_seconds, ctl))
        return r
    PRF.StepProfiler._summarize = _summ
    colls = []
    orig_e = PRF.StepProfiler.end_window
    def _ew(self):
        r = orig_e(self)
        if r is not None: colls.append(r.collectives)
        return r
    PRF.StepProfiler.end_window = _ew
    import collections
    acc = collections.defaultdict(list)
    def timed(owner, name, label):
        orig = getattr(owner, name)
        def w(*a, **k):
            t = time.perf_counter()
            try: return orig(*a, **k)
            finally: acc[label].append(time.perf_counter() - t)
        setattr(owner, name, w)
    import autocomp.planner as PL, autocomp.profiler as PR, autocomp.policy.engine as EN, autocomp.cost_model as CM
    timed(PL.Planner if hasattr(PL, "Planner") else PL.WindowPlanner, "decide", "planner.decide")
    timed(EN.PolicyEngine, "decide", "engine.decide")
    timed(EN.PolicyEngine, "_search", "engine._search")
    timed(CM.CostModel, "refit_if_due", "costmodel.refit")
    timed(PR.StepProfiler, "end_window", "profiler.end_window")
    timed(A.AdaptiveLoop, "_reread_contention", "reread_contention")
    timed(A.AdaptiveLoop, "_broadcast", "broadcast")
    timed(A.AdaptiveLoop, "_apply", "apply")
    timed(A.AdaptiveLoop, "_measurement", "measurement")
    timed(A.AdaptiveLoop, "_safe_quiet_windows", "quiet")
    from autocomp_bench.tasks import build_task
    from autocomp_bench.worker import attach
    task = build_task(args.task)
    torch.manual_seed(1)
    kw = {"target_overlap": 0.9}
    if args.plan: kw["plan"] = json.loads(args.plan)
    att = attach("adaptive", task.build_model(), {"adaptive_kwargs": kw})
    opt = task.make_optimizer(att.ddp.parameters())
    if args.lat > 0: att.ctl.adaptive.planner.meter.config.prior_latency_s = args.lat * 1e-6
    rank = dist.get_rank(); loop = att.ctl.adaptive
    rows = []
    for step in range(args.steps):
        x, y = task.batch(rank, step, 1)
        sampled = loop.next_boundary(step) - step <= loop.config.sampled_steps if step > 0 else False
        dist.barrier()
        t0 = time.perf_counter()
        loss = task.loss(att.ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        plan_kinds = set(att.ctl.plan.values())
        rows.append((step, time.perf_counter() - t0, sampled, "fp16" if plan_kinds == {"fp16:ef=false"} else "mixed"))
    if rank == 0:
        tags = {}
        for step, s, sampled, plan in rows[5:]:
            kind = marks.get(step, (None,))[0] or ("sampled" if sampled else "other-" + plan)
            tags.setdefault(kind, []).append(s)
        base = statistics.median(tags.get("other-fp16") or tags["other-mixed"])
        print(f"{args.task} @ {args.rate}: {len(rows)} steps, median other {base*1e3:.2f} ms")
        for k, v in tags.items():
            print(f"  {k:9s} n={len(v):4d} median {statistics.median(v)*1e3:7.2f} ms  excess total {sum(x - base for x in v):.3f} s")
        inside = [d for k, d in marks.values() if k == "boundary"]
        print(f"  rank-0 _boundary (no probe) median {statistics.median(inside)*1e3:.2f} ms over {len(inside)}")
        json.dump({"rows": rows, "marks": marks}, open(args.out, "w"))
        json.dump(summ, open(args.out + ".summ", "w"))
        json.dump([[[(str(k), b, t) for k, b, t in st] for st in w] for w in colls], open(args.out + ".coll", "w"))
        cols = list(zip(*summ[20:]))
        print("  medians step/compute/exposed/work/backward/ctl:", " ".join(f"{statistics.median(c)*1e3:.2f}" for c in cols))
        for k, v in acc.items():
            print(f"  {k:22s} n={len(v):3d} median {statistics.median(v)*1e3:7.2f} ms total {sum(v):.3f} s")
    att.ctl.close()
    dist.destroy_process_group()

p = argparse.ArgumentParser()
p.add_argument("--task", default="cnn"); p.add_argument("--rate", type=float, default=200)
p.add_argument("--steps", type=int, default=1200); p.add_argument("--out", default="/tmp/stepcost.json")
p.add_argument("--worker", action="store_true"); p.add_argument("--plan", default=""); p.add_argument("--lat", type=float, default=0)
a = p.parse_args()
if a.worker: worker(a)
else: run_ranks_on_shaped_link(__file__, a.rate, port=29615, timeout_s=900)
