"""Repeat ProbeRunner.opening on a shaped 2-rank link; log each rank's local pass times."""
import argparse, json, os, random, sys, time
sys.path.insert(0, "/work/main/docs/benchmarks-matrix-2026-12-01/session-55")
def worker(a):
    import torch, torch.distributed as dist
    from autocomp import opening as op
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    runner = op.ProbeRunner()
    local = []
    orig = runner.time_all_reduce
    def logged(size, device, group):
        s = orig(size, device, group); local.append((size, round(s*1e3, 2))); return s
    runner.time_all_reduce = logged
    rng = random.Random(rank * 1000 + 7)
    rows = []
    for trial in range(a.trials):
        dist.barrier()
        time.sleep(a.idle + (rng.random() * a.skew))
        local.clear()
        t0 = time.perf_counter()
        res = runner.opening(a.raw, 0.034, torch.device("cpu"), None, opening_ratio=2.0)
        took = time.perf_counter() - t0
        rows.append({"trial": trial, "size": res.payload_bytes, "seconds": round(res.seconds*1e3, 2),
                     "mbit": round(res.payload_bytes*8/res.seconds/1e6, 1), "small": res.latency_probe, "local": list(local), "took": round(took, 3)})
    all_rows = [None, None]
    dist.all_gather_object(all_rows, rows)
    if rank == 0:
        for r0, r1 in zip(*all_rows):
            print(r0["trial"], "agreed", r0["size"], r0["seconds"], "ms", r0["mbit"], "Mbit/s  r0", r0["local"], " r1", r1["local"], "took", r0["took"], flush=True)
    dist.destroy_process_group()
p = argparse.ArgumentParser(); p.add_argument("--rate", type=float, default=10); p.add_argument("--raw", type=int, default=1135144)
p.add_argument("--trials", type=int, default=12); p.add_argument("--idle", type=float, default=0.3); p.add_argument("--skew", type=float, default=0.2)
p.add_argument("--worker", action="store_true")
a = p.parse_args()
if a.worker: worker(a)
else:
    from paired import run_ranks_on_shaped_link
    run_ranks_on_shaped_link(__file__, a.rate, port=29641, timeout_s=600)
