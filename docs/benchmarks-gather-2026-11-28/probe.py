# The opening's contention probe, repeated on a shaped link: its spread, with the default
# pair count and with more pairs, alternating. python probe.py RATE N   (as root; PYTHONPATH=<repo>)
import json, os, sys
import torch, torch.distributed as dist


def run(rank, n, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from autocomp import opening
    runner = opening.ProbeRunner()
    size = 262144
    seconds = runner.time_all_reduce(size, torch.device("cpu"), None)
    res = {}
    for i in range(n):
        for pairs in (3, 7):
            opening.CONTENTION_PAIRS = pairs
            res.setdefault(pairs, []).append(runner.contention(size, seconds, torch.device("cpu"), None))
    if rank == 0:
        json.dump({"transfer_seconds": seconds, **{str(k): v for k, v in res.items()}}, open(out, "w"))
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "rank":
        run(int(os.environ["RANK"]), int(sys.argv[2]), sys.argv[3])
        sys.exit(0)
    from autocomp_bench.shaped_link import ShapedLink, parse_rate
    import tempfile
    out = tempfile.mktemp(prefix="autocomp-probe-")
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=parse_rate(sys.argv[1]))) as link:
        procs = [link.popen(h, [sys.executable, __file__, "rank", sys.argv[2], out],
                            env=link.rank_env(h, 2, 29576)) for h in range(2)]
        for p in procs:
            p.wait(timeout=600)
    d = json.load(open(out))
    print("transfer", round(d["transfer_seconds"], 4))
    for k in ("3", "7"):
        v = sorted(d[k])
        print(k, "pairs:", " ".join(f"{x*1e9:.0f}" for x in v), "ns/byte; zeros", sum(x == 0 for x in v))
