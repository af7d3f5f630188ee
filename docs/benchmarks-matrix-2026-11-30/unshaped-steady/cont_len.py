"""Contention readings by compute-loop cap (CONTENTION_SECONDS high bound), alternating caps,
at the opening probe's own size and time, on loopback (2 gloo ranks)."""
import datetime, os, sys, tempfile, time, statistics, json
import torch, torch.distributed as dist, torch.multiprocessing as mp
import autocomp.opening as O
from autocomp_bench.overhead import _workload
TASK = sys.argv[1]; REPS = int(sys.argv[2]); CAPS = [float(c) for c in sys.argv[3].split(",")]
def main(rank, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300))
    model = _workload(TASK)[0]
    raw = sum(p.numel() * 4 for p in model.parameters())
    runner = O.ProbeRunner()
    dev = torch.device("cpu")
    probe = runner.opening(raw, 0.01, dev, None)  # size and transfer time as the opening finds them
    res = {c: [] for c in CAPS}
    for rep in range(REPS):
        for c in (CAPS if rep % 2 == 0 else CAPS[::-1]):
            O.CONTENTION_SECONDS = (min(0.01, c), c)
            t = time.perf_counter()
            reading = runner.contention(probe.payload_bytes, probe.seconds, dev, None)
            res[c].append((reading.seconds_per_byte * 1e9, reading.slowdown, reading.settled, time.perf_counter() - t))
    if rank == 0:
        print(f"{TASK}: probe {probe.payload_bytes/1e6:.1f} MB in {probe.seconds*1e3:.1f} ms")
        for c, rows in res.items():
            ns = [r[0] for r in rows]
            print(f"cap {c*1e3:4.0f} ms: ns/B median {statistics.median(ns):.3f} [{min(ns):.3f}, {max(ns):.3f}] zeros {sum(1 for x in ns if x == 0)}/{len(ns)} settled {sum(r[2] for r in rows)}/{len(rows)} slowdown median {statistics.median(r[1] for r in rows):.3f} seconds median {statistics.median(r[3] for r in rows):.3f}")
            print("   ", " ".join(f"{x:.2f}" for x in ns))
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(main, args=(tempfile.mktemp(),), nprocs=2)
