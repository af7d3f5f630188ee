"""Boundary link probes over a tbf-shaped pair (or loopback): the first timed pass against the
fastest of three, at the size LinkProbe gives at the opening's estimate, between bursts of
compute as in training.   python probe_passes.py RATE_MBIT|unshaped REPS"""
import datetime, os, sys, time, statistics, tempfile
import torch, torch.distributed as dist
def run():
    from autocomp.opening import ProbeRunner, _pass_seconds
    from autocomp.link_probe import LinkProbe
    from autocomp.link_model import LinkEstimate, link_bytes
    from autocomp.compressors import Collective
    torch.set_num_threads(1)
    dev = torch.device("cpu"); runner = ProbeRunner()
    probe = runner.opening(4 << 20, 0.01, dev, None)
    rate = link_bytes(Collective.ALL_REDUCE, probe.payload_bytes, 2) / probe.seconds
    est = LinkEstimate(bandwidth_bytes_per_s=rate, latency_s=50e-6, samples=1, rel_residual=0.0)
    size = LinkProbe().size(est, 2, 5.0).payload_bytes
    view = runner._view(size, dev)
    m = torch.randn(256, 256)
    rows = []
    for rep in range(int(sys.argv[2])):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.05:
            m @ m
        dist.barrier()
        _pass_seconds(view, None)
        passes = [_pass_seconds(view, None) for _ in range(3)]
        agreed = torch.tensor([-p for p in passes], dtype=torch.float64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # each pass's fastest rank, as combine_link_busy
        rows.append([-x for x in agreed.tolist()])
    if dist.get_rank() == 0:
        ratios = [r[0] / min(r) for r in rows]
        print(f"{sys.argv[1]}: estimate {rate*8/1e6:.0f} Mbit/s, probe {size/1e3:.0f} kB, first timed pass {statistics.median(r[0] for r in rows)*1e3:.1f} ms median")
        print(f"  first/fastest-of-3: median {statistics.median(ratios):.3f}, max {max(ratios):.3f}, over 1.10 in {sum(x > 1.10 for x in ratios)}/{len(ratios)}, over 1.5 in {sum(x > 1.5 for x in ratios)}/{len(ratios)}")
        print("  ", " ".join(f"{x:.2f}" for x in ratios), flush=True)
    dist.destroy_process_group()
def loop_rank(rank, store):
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300)); run()
if __name__ == "__main__":
    if os.environ.get("CAP_WORKER"):
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300)); run()
    elif sys.argv[1] == "unshaped":
        import torch.multiprocessing as mp
        mp.spawn(loop_rank, args=(tempfile.mktemp(),), nprocs=2)
    else:
        from autocomp_bench.shaped_link import ShapedLink
        with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=float(sys.argv[1]))) as link:
            env = {"CAP_WORKER": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
            procs = [link.popen(h, [sys.executable, *sys.argv], env={**link.rank_env(h, world_size=2, master_port=29549), **env}) for h in range(2)]
            print("exit codes", [p.wait(timeout=900) for p in procs])
