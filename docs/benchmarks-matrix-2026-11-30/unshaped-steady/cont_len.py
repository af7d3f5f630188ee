"""Contention readings by compute-loop cap (CONTENTION_SECONDS high bound), caps alternating,
at the opening probe's own size and time, 2 gloo ranks on loopback or over a tbf-shaped
veth pair.
    python cont_len.py TASK unshaped REPS CAPS      e.g. ngram unshaped 8 0.03,0.015,0.01
    python cont_len.py TASK RATE_MBIT REPS CAPS     e.g. lstm-lm 50 8 0.03,0.01
"""
import datetime, os, sys, tempfile, time, statistics
import torch, torch.distributed as dist, torch.multiprocessing as mp


def measure() -> None:
    """Every rank, in an initialized process group."""
    import autocomp.opening as O
    from autocomp_bench.tasks import build_task
    torch.set_num_threads(1)
    task, rate, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    caps = [float(c) for c in sys.argv[4].split(",")]
    model = build_task(task).build_model()
    raw = sum(p.numel() * 4 for p in model.parameters())
    runner = O.ProbeRunner(); dev = torch.device("cpu")
    probe = runner.opening(raw, 0.01, dev, None)  # size and transfer time as the opening finds them
    res = {c: [] for c in caps}
    for rep in range(reps):
        for c in (caps if rep % 2 == 0 else caps[::-1]):
            O.CONTENTION_SECONDS = (min(0.01, c), c)
            t = time.perf_counter()
            r = runner.contention(probe.payload_bytes, probe.seconds, dev, None)
            res[c].append((r.seconds_per_byte * 1e9, r.slowdown, r.settled, time.perf_counter() - t))
    if dist.get_rank() == 0:
        where = "loopback" if rate == "unshaped" else f"{rate} Mbit/s"
        print(f"{task} @ {where}: probe {probe.payload_bytes/1e3:.0f} kB in {probe.seconds*1e3:.1f} ms")
        for c, rows in res.items():
            ns = [x[0] for x in rows]
            print(f"  cap {c*1e3:4.0f} ms: ns/B median {statistics.median(ns):.3f} [{min(ns):.3f}, {max(ns):.3f}] "
                  f"zeros {sum(1 for x in ns if x == 0)}/{len(ns)} settled {sum(x[2] for x in rows)}/{len(rows)} "
                  f"slowdown median {statistics.median(x[1] for x in rows):.3f} seconds median {statistics.median(x[3] for x in rows):.3f}")
            print("     ", " ".join(f"{x:.2f}" for x in ns), flush=True)
    dist.destroy_process_group()


def loopback_rank(rank: int, store: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=300))
    measure()


if __name__ == "__main__":
    if os.environ.get("CAP_WORKER"):  # a rank inside the shaped link's namespaces
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300)); measure()
    elif sys.argv[2] == "unshaped":
        mp.spawn(loopback_rank, args=(tempfile.mktemp(),), nprocs=2)
    else:
        from autocomp_bench.shaped_link import ShapedLink
        with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=float(sys.argv[2]))) as link:
            env = {"CAP_WORKER": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
            procs = [link.popen(h, [sys.executable, *sys.argv],
                                env={**link.rank_env(h, world_size=2, master_port=29547), **env})
                     for h in range(2)]
            print("exit codes", [p.wait(timeout=900) for p in procs])
