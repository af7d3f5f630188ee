# The opening's contention probe N times per setting on a shaped link, alternating one batch
# of pairs (before) and up to two (after); readings in ns a byte.  python zeros.py RATE N
import json, os, sys, time
import torch, torch.distributed as dist

def run(rank, n, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from autocomp import opening
    runner = opening.ProbeRunner()
    size = 262144
    seconds = runner.time_all_reduce(size, torch.device("cpu"), None)
    settings = {"7x1": (7, 1), "7x2": (7, 2)}
    res = {k: [] for k in settings}
    for i in range(n):
        for key, (pairs, batches) in settings.items():
            opening.CONTENTION_PAIRS, opening.CONTENTION_BATCHES = pairs, batches
            t = time.perf_counter()
            v = runner.contention(size, seconds, torch.device("cpu"), None)
            res[key].append((v, time.perf_counter() - t))
    if rank == 0:
        json.dump({"transfer_seconds": seconds, **{str(k): v for k, v in res.items()}}, open(out, "w"))
    dist.destroy_process_group()

if __name__ == "__main__":
    if sys.argv[1] == "rank":
        run(int(os.environ["RANK"]), int(sys.argv[2]), sys.argv[3]); sys.exit(0)
    from autocomp_bench.shaped_link import ShapedLink, parse_rate
    out = sys.argv[3] if len(sys.argv) > 3 else "/tmp/s27/probe/zeros.json"
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=parse_rate(sys.argv[1]))) as link:
        procs = [link.popen(h, [sys.executable, __file__, "rank", sys.argv[2], out], env=link.rank_env(h, 2, 29576)) for h in range(2)]
        for p in procs: p.wait(timeout=900)
    d = json.load(open(out))
    print("transfer", round(d["transfer_seconds"], 4))
    for k in ("7x1", "7x2"):
        v = sorted(x for x, _ in d[k]); secs = sorted(s for _, s in d[k])
        print(k, ":", " ".join(f"{x*1e9:.0f}" for x in v), "ns/byte; zeros", sum(x == 0 for x in v),
              f"of {len(v)}; seconds median {secs[len(secs)//2]:.2f} max {secs[-1]:.2f}")
