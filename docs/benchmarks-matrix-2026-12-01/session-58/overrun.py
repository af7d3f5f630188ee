"""A boundary probe sized at a link estimate 8x too fast, on a shaped 10 Mbit/s link: wall time
and reading of ProbeRunner.fastest_all_reduce with and without the overrun stop, alternating."""
import argparse, os, statistics, sys, time
sys.path.insert(0, "/work/main/docs/benchmarks-matrix-2026-12-01/session-55")
def worker(a):
    import torch, torch.distributed as dist
    from autocomp.link_model import LinkEstimate
    from autocomp.link_probe import BOUNDARY_PROBE_PASSES, LinkProbe
    from autocomp.compressors import Collective
    from autocomp.opening import ProbeRunner
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    wrong = LinkEstimate(latency_s=50e-6, bandwidth_bytes_per_s=a.estimate_mbit * 1e6 / 8, samples=1, rel_residual=0.0)
    plan = LinkProbe().size(wrong, 2, 3.0)
    expected = wrong.seconds(Collective.ALL_REDUCE, plan.payload_bytes, 2)
    runner = ProbeRunner()
    rows = {"stop": [], "all": []}
    for trial in range(a.trials):
        for arm in (("stop", "all") if trial % 2 == 0 else ("all", "stop")):
            dist.barrier(); time.sleep(0.3)  # a window's compute: tbf's bucket refills
            t0 = time.perf_counter()
            s = runner.fastest_all_reduce(plan.payload_bytes, torch.device("cpu"), None, BOUNDARY_PROBE_PASSES - 1,
                                          expected_pass_seconds=expected if arm == "stop" else None)
            wall = time.perf_counter() - t0
            rows[arm].append((wall, plan.payload_bytes * 8 / s / 1e6))
    if dist.get_rank() == 0:
        print(f"estimate {a.estimate_mbit} Mbit/s on a {a.rate} Mbit/s link: probe {plan.payload_bytes} B, expected pass {expected*1e3:.1f} ms, planned {plan.seconds:.3f} s")
        for arm, r in rows.items():
            print(f"  {arm:4s} wall s: " + " ".join(f"{w:.3f}" for w, _ in r) + f"   median {statistics.median(w for w, _ in r):.3f};  reading Mbit/s: " + " ".join(f"{m:.1f}" for _, m in r))
    dist.destroy_process_group()
p = argparse.ArgumentParser(); p.add_argument("--rate", type=float, default=10); p.add_argument("--estimate-mbit", type=float, default=82)
p.add_argument("--trials", type=int, default=6); p.add_argument("--worker", action="store_true")
a = p.parse_args()
if a.worker: worker(a)
else:
    from paired import run_ranks_on_shaped_link
    run_ranks_on_shaped_link(__file__, a.rate, port=29651, timeout_s=600)
