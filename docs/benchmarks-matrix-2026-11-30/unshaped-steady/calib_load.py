"""psgd16/fp16 replay time on fc1's shape: alone vs beside a peer process doing the same."""
import sys, time, torch, torch.multiprocessing as mp
from autocomp.opening import _replay_seconds
from autocomp.compressors import build_compressor
SHAPE = (3072, 683) if len(sys.argv) < 2 else tuple(int(x) for x in sys.argv[1].split("x"))
SPECS = ["powersgd:rank=16,ef=true", "powersgd:rank=4,ef=true", "fp16:ef=false"]
def run(tag, q, barrier):
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(SHAPE, generator=g) * 1e-3
    barrier.wait()
    out = {}
    for spec in SPECS:
        out[spec] = _replay_seconds(build_compressor(spec), grad, 2, calls=5)
    q.put((tag, out))
def main():
    ctx = mp.get_context("spawn")
    for n in (1, 2, 1, 2):
        q = ctx.Queue(); b = ctx.Barrier(n)
        ps = [ctx.Process(target=run, args=(f"{n}procs-{i}", q, b)) for i in range(n)]
        [p.start() for p in ps]; res = [q.get() for _ in ps]; [p.join() for p in ps]
        for tag, out in res:
            print(tag, {k.split(",")[0]: round(v * 1e3, 2) for k, v in out.items()})
if __name__ == "__main__":
    main()
