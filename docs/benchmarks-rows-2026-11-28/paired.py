# Scratch check (docs/benchmarks.md, twenty-first session): two gpt models in the same two
# ranks, stepped alternately, so drift hits both alike: PyTorch's powerSGD_hook (one bucket)
# against autocomp's static rank-4 plan (DDP's default buckets, or one with ONE=1).
# python paired.py STEPS RATE   (as root; PYTHONPATH=<repo>; PLAN=json overrides the plan)
import json, os, statistics, subprocess, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def run(rank, steps, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    import autocomp
    from autocomp_bench.tasks import build_task
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    task = build_task(os.environ.get("TASK", "gpt"))
    torch.manual_seed(0)
    ma = task.build_model()
    torch.manual_seed(0)
    mb = task.build_model()
    a = DDP(ma, bucket_cap_mb=1000, init_sync=False)
    st = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4,
        start_powerSGD_iter=2, min_compression_rate=2, use_error_feedback=True, warm_start=True)
    a.register_comm_hook(st, powerSGD_hook.powerSGD_hook)
    b = DDP(mb, bucket_cap_mb=1000 if os.environ.get("ONE") else None, init_sync=False)
    plan = json.loads(os.environ.get("PLAN", '{"*": "powersgd:rank=4"}'))
    kw = {"run_dir": f"/tmp/autocomp-paired-runlog-{rank}-{os.getpid()}"} if os.environ.get("RUNLOG") else {"run_dir": False}
    ctl = autocomp.wrap(b, plan=plan, warmup_steps=2, **kw)
    opts = {"hook": task.make_optimizer(a.parameters()), "autocomp": task.make_optimizer(b.parameters())}
    ddps = {"hook": a, "autocomp": b}
    times = {"hook": [], "autocomp": []}
    for step in range(steps):
        order = ("hook", "autocomp") if step % 2 == 0 else ("autocomp", "hook")
        for name in order:
            ddp, opt = ddps[name], opts[name]
            t0 = time.perf_counter()
            x, y = task.batch(rank, step, 0)
            loss = task.loss(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss.item()
            e = torch.tensor([time.perf_counter()], dtype=torch.float64)
            dist.all_reduce(e, op=dist.ReduceOp.MAX)
            times[name].append(time.perf_counter() - t0)
    if rank == 0:
        res = {k: statistics.median(v[10:]) for k, v in times.items()}
        ratios = [b_ / a_ for a_, b_ in zip(times["hook"][10:], times["autocomp"][10:])]
        res["median ratio autocomp/hook"] = statistics.median(ratios)
        res["buckets"] = b._get_ddp_logging_data()["rebuilt_bucket_sizes"]
        with open(out, "w") as f:
            json.dump(res, f)
    ctl.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "rank":
        run(int(os.environ["RANK"]), int(sys.argv[2]), sys.argv[3])
        sys.exit(0)
    from autocomp_bench.shaped_link import ShapedLink, parse_rate
    import tempfile
    steps, rate = int(sys.argv[1]), sys.argv[2]
    out = tempfile.mktemp(prefix="autocomp-paired-")
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=parse_rate(rate))) as link:
        procs = [link.popen(h, [sys.executable, __file__, "rank", str(steps), out],
                            env=link.rank_env(h, 2, 29578)) for h in range(2)]
        for p in procs:
            p.wait(timeout=900)
    print(open(out).read())
