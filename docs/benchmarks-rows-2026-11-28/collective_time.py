# Scratch check (docs/benchmarks.md, twenty-first session): one collective's time on the shaped
# link, all-reduce of float32 against all-gather of uint8, same bytes per rank.
# python collective_time.py RATE KB   (as root; PYTHONPATH=<repo>)
import json, os, statistics, sys, time
import torch, torch.distributed as dist


def run(rank, kb, out):
    dist.init_process_group("gloo", rank=rank, world_size=2)
    n = kb * 1000
    res = {}
    for name in ("allreduce", "allgather", "allreduce", "allgather"):
        times = []
        for _ in range(15):
            if name == "allreduce":
                t = torch.ones(n // 4)
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(t)
            else:
                t = torch.ones(n, dtype=torch.uint8)
                o = torch.empty(2 * n, dtype=torch.uint8)
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_gather_into_tensor(o, t)
            times.append(time.perf_counter() - t0)
        res.setdefault(name, []).append(round(statistics.median(times[3:]) * 1e3, 2))
    if rank == 0:
        json.dump(res, open(out, "w"))
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "rank":
        run(int(os.environ["RANK"]), int(sys.argv[2]), sys.argv[3])
        sys.exit(0)
    from autocomp_bench.shaped_link import ShapedLink, parse_rate
    import tempfile
    out = tempfile.mktemp(prefix="autocomp-coll-")
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=parse_rate(sys.argv[1]))) as link:
        procs = [link.popen(h, [sys.executable, __file__, "rank", sys.argv[2], out],
                            env=link.rank_env(h, 2, 29579)) for h in range(2)]
        for p in procs:
            p.wait(timeout=300)
    print(sys.argv[1], sys.argv[2], "kB ms:", open(out).read())
