"""Median gloo all-reduce time by size on a shaped 2-rank link (and, alternating, with a sleep between calls so tbf's bucket refills)."""
import argparse, os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session-55"))
def worker(a):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out = {}
    for nbytes in (4, 1024, 4096, 16384, 32768, 65536, 98304, 131072, 262144, 1048576):
        x = torch.zeros(nbytes // 4)
        for _ in range(3): dist.all_reduce(x)
        times = []
        for i in range(30):
            dist.barrier(); time.sleep(0.015)  # idle like a step's compute: tbf refills
            t = time.perf_counter(); dist.all_reduce(x); times.append(time.perf_counter() - t)
        back = []
        for i in range(10):
            dist.barrier()
            t = time.perf_counter(); dist.all_reduce(x); dist.all_reduce(x); back.append((time.perf_counter() - t) / 2)
        out[nbytes] = (statistics.median(times), statistics.median(back))
    if dist.get_rank() == 0:
        for n, (a1, b1) in out.items():
            print(f"{n:8d} B  after idle {a1*1e3:7.3f} ms ({n*8/a1/1e6 if a1 else 0:7.1f} Mbit/s)   back-to-back {b1*1e3:7.3f} ms")
    dist.destroy_process_group()
p = argparse.ArgumentParser(); p.add_argument("--rate", type=float, default=100); p.add_argument("--worker", action="store_true")
a = p.parse_args()
if a.worker: worker(a)
else:
    from paired import run_ranks_on_shaped_link
    run_ranks_on_shaped_link(__file__, a.rate or None, port=29631, timeout_s=300)
