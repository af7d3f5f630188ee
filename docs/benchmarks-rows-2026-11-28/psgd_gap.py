# Scratch check (docs/benchmarks.md, twenty-first session): gpt, 2 gloo ranks, static plan vs
# PyTorch's powerSGD_hook (one bucket) vs a send-nothing hook; cProfile rank 0 with PROF=1.
# python psgd_gap.py hook|static|static1|limit STEPS [RATE e.g. 50mbit]  (PLAN=json, CLOCK=1,
# NOOBS=1, NORUNLOG=1, BUCKETS=1; run from /tmp with PYTHONPATH=<repo>, as root for a shaped link)
"""gpt on loopback, 2 gloo ranks: PyTorch powerSGD hook vs autocomp static psgd4; cProfile rank 0."""
import cProfile, os, pstats, sys, time, io
import torch, torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def run(rank, world, mode, store_path, steps, out):
    torch.set_num_threads(1)
    if store_path == "env":
        dist.init_process_group("gloo", rank=rank, world_size=world)
    else:
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    import autocomp
    from autocomp_bench.tasks import build_task
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    task = build_task(os.environ.get("TASK", "gpt"))
    torch.manual_seed(0)
    model = task.build_model()
    ctl = None
    if mode == "hook":
        ddp = DDP(model, bucket_cap_mb=1000, init_sync=False)
        st = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2, min_compression_rate=2, use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(st, powerSGD_hook.powerSGD_hook)
    elif mode == "limit":
        from autocomp_bench.worker import send_nothing
        ddp = DDP(model, init_sync=False)
        ddp.register_comm_hook(None, send_nothing)
    else:
        # bucket_cap_mb=None keeps DDP's small first bucket (torch 2.13 drops it when any
        # cap is passed); static1 is one bucket.
        ddp = DDP(model, bucket_cap_mb=1000 if mode == "static1" else None, init_sync=False)
        ctl = autocomp.wrap(ddp, plan=__import__("json").loads(os.environ.get("PLAN", '{"*": "powersgd:rank=4"}')), warmup_steps=2, **({"run_dir": False} if os.environ.get("NORUNLOG") else {"run_dir": "/tmp/autocomp-gap-runlog-%d" % rank}))
    opt = task.make_optimizer(ddp.parameters())
    times = []
    prof = cProfile.Profile()
    for step in range(steps):
        if step == 20 and rank == 0 and os.environ.get("PROF"): prof.enable()
        t0 = time.perf_counter()
        x, y = task.batch(rank, step, 0)
        loss = task.loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if ctl is not None and not os.environ.get("NOOBS"): ctl.observe_loss(loss.item())
        else: loss.item()
        if os.environ.get("CLOCK"):
            e = torch.tensor([time.perf_counter()], dtype=torch.float64)
            dist.all_reduce(e, op=dist.ReduceOp.MAX)
        times.append(time.perf_counter() - t0)
    if rank == 0 and os.environ.get("BUCKETS"):
        data = ddp._get_ddp_logging_data()
        print({k: v for k, v in data.items() if "bucket" in k}, flush=True)
    if rank == 0:
        prof.disable()
        s = io.StringIO()
        if os.environ.get("PROF"):
            pstats.Stats(prof, stream=s).sort_stats(os.environ.get("SORT", "tottime")).print_stats(30)
        times = sorted(times[20:])
        with open(out, "w") as f:
            f.write(f"{mode} median {times[len(times)//2]*1e3:.2f} ms p10 {times[len(times)//10]*1e3:.2f} mean {sum(times)/len(times)*1e3:.2f}\n" + s.getvalue())
    if ctl is not None: ctl.close()
    dist.destroy_process_group()

if __name__ == "__main__" and len(sys.argv) > 3 and sys.argv[3] == "rank":
    run(int(os.environ["RANK"]), 2, sys.argv[1], "env", int(sys.argv[2]), sys.argv[4])
    sys.exit(0)
if __name__ == "__main__" and len(sys.argv) > 3 and sys.argv[3].endswith("mbit"):
    from autocomp_bench.shaped_link import ShapedLink, parse_rate
    mode, steps = sys.argv[1], int(sys.argv[2])
    import tempfile
    where = tempfile.mkdtemp(prefix="autocomp-gap-")
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=parse_rate(sys.argv[3]))) as link:
        procs = [link.popen(h, [sys.executable, __file__, mode, str(steps), "rank", f"{where}/{mode}.txt"], env=link.rank_env(h, 2, 29577)) for h in range(2)]
        for p in procs: p.wait(timeout=600)
        import subprocess
        for ns, dev in zip(link.namespaces, link.interfaces):
            out = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout
            print(ns, " ".join(out.split()))
    print(open(f"{where}/{mode}.txt").read())
    sys.exit(0)
if __name__ == "__main__":
    mode, steps = sys.argv[1], int(sys.argv[2])
    import tempfile
    where = tempfile.mkdtemp(prefix="autocomp-gap-")
    mp.spawn(run, args=(2, mode, f"{where}/store", steps, f"{where}/{mode}.txt"), nprocs=2)
    print(open(f"{where}/{mode}.txt").read())
