# Two gpt models in the same two ranks, both autocomp adaptive with every layer pinned (plans A
# and B), stepped alternately at a shaped rate; records each step's raw hook timeline (profiler
# stamps) and each window's record, to find where plan B's extra step time goes.
# python timeline.py STEPS RATE OUTDIR   (as root; PYTHONPATH=<repo>; PLAN_A / PLAN_B json)
import json, os, statistics, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

RAW = {}
CUR = [None]


def patch():
    from autocomp import profiler as P
    init, summ = P.StepProfiler.__init__, P.StepProfiler._summarize

    def __init__(self, *a, **k):
        init(self, *a, **k)
        self.raw_steps = []
        self.tag = CUR[0]

    def _summarize(self, step, next_start, read):
        out = summ(self, step, next_start, read)
        t0 = read(step.started)
        r = lambda s: None if s is None else round((read(s) - t0) * 1e3, 3)
        self.raw_steps.append({
            "fwd": r(step.forward_done), "next": r(next_start),
            "hooks": [(c.bucket_index, r(c.entered), r(c.exited)) for c in step.hooks],
            "waits": [(r(a), r(b)) for a, b in step.waits],
            "finishes": [(r(a), r(b)) for a, b in step.finishes],
            "coll": [(str(c.kind), c.payload_bytes, r(c.launched), r(c.done)) for c in step.collectives],
            "ctl": [(r(a), r(b)) for a, b in step.controller],
            "summary": None if out is None else {k: getattr(out, k) for k in ("step_seconds", "backward_seconds", "hideable_seconds", "comm_busy_seconds", "compress_seconds", "exposed_seconds", "compute_seconds")},
        })
        return out

    P.StepProfiler.__init__, P.StepProfiler._summarize = __init__, _summarize
    old = os.environ.get("OLD", "")  # models that launch the last bucket's rest at once
    if old:
        from autocomp import hook as H
        orig = H.launch_bucket

        def launch_bucket(*a, **k):
            if CUR[0] in old:
                k["defer_rest"] = False
            return orig(*a, **k)

        H.launch_bucket = launch_bucket


def run(rank, steps, outdir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    patch()
    import autocomp
    from autocomp_bench.tasks import build_task
    task = build_task(os.environ.get("TASK", "gpt"))
    plans = {k: json.loads(os.environ[f"PLAN_{k}"]) for k in ("A", "B")}
    ddps, opts, ctls, times = {}, {}, {}, {}
    for k in ("A", "B"):
        torch.manual_seed(0)
        m = task.build_model()
        ddps[k] = DDP(m, bucket_cap_mb=None, init_sync=False)
        os.environ["AUTOCOMP_RECORD_WINDOWS"] = f"{outdir}/windows-{k}.jsonl" if rank == 0 else ""
        CUR[0] = k
        ctls[k] = autocomp.wrap(ddps[k], target_overlap=0.9, plan=plans[k], window=10,
                                warmup_steps=2, run_dir=False)
        opts[k] = task.make_optimizer(ddps[k].parameters())
        times[k] = []
    for step in range(steps):
        for k in (("A", "B") if step % 2 == 0 else ("B", "A")):
            os.environ["AUTOCOMP_RECORD_WINDOWS"] = f"{outdir}/windows-{k}.jsonl" if rank == 0 else ""
            ddp, opt = ddps[k], opts[k]
            CUR[0] = k
            t0 = time.perf_counter()
            x, y = task.batch(rank, step, 0)
            loss = task.loss(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss.item()
            e = torch.tensor([time.perf_counter()], dtype=torch.float64)
            dist.all_reduce(e, op=dist.ReduceOp.MAX)
            times[k].append(time.perf_counter() - t0)
    raw = {}
    from autocomp import profiler as P
    import gc
    profs = [o for o in gc.get_objects() if isinstance(o, P.StepProfiler)]
    for c in ctls.values():
        c.close()
    if rank in (0, 1):
        res = {k: statistics.median(v[20:]) for k, v in times.items()}
        res["ratio B/A"] = statistics.median(b / a for a, b in zip(times["A"][20:], times["B"][20:]))
        res["profilers"] = {p.tag: p.raw_steps for p in profs}
        with open(f"{outdir}/raw-{rank}.json", "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "rank":
        run(int(os.environ["RANK"]), int(sys.argv[2]), sys.argv[3])
        sys.exit(0)
    from autocomp_bench.shaped_link import ShapedLink, parse_rate
    steps, rate, outdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.makedirs(outdir, exist_ok=True)
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=parse_rate(rate))) as link:
        procs = [link.popen(h, [sys.executable, __file__, "rank", str(steps), outdir],
                            env=link.rank_env(h, 2, 29577)) for h in range(2)]
        for p in procs:
            p.wait(timeout=900)
    print(json.dumps({k: v for k, v in json.load(open(f"{outdir}/raw-0.json")).items() if k != "profilers"}))
