"""Top-k hook work on a dense and on a mostly-zero tensor: the selection's share of it."""
import statistics, time, torch, sys
from autocomp.compressors import build_compressor
from autocomp_bench.compressor_cost import _HookStep
torch.set_num_threads(1)
c = build_compressor("topk:ratio=0.01")
def timeit(fn, reps=7):
    ts=[]
    for _ in range(reps):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return statistics.median(ts)
for numel in (2**20, 2**22, 2**23):
    shape = torch.Size([numel // 64, 64])
    g = torch.randn(shape) * 1e-4
    for share in (1.0, 0.25, 0.05, 0.006, 0.0):
        x = g.clone()
        if share < 1:
            rows = x.shape[0]
            keep = torch.zeros(rows, dtype=torch.bool); keep[torch.randperm(rows)[: int(rows * share)]] = True
            x[~keep] = 0
        hs = _HookStep(c, shape, 0)
        def step():
            hs.residual = None
            hs.run(x, 0)
        total = timeit(step)
        flat = x.reshape(-1)
        k = max(1, int(numel * 0.01))
        sel_dense = timeit(lambda: torch.topk(flat.abs(), k, sorted=False))
        cnt = timeit(lambda: torch.count_nonzero(flat))
        nz = timeit(lambda: flat.nonzero())
        print(f"numel {numel:>8} share {share:<6} hook {total*1e3:8.2f} ms  dense topk {sel_dense*1e3:8.2f}  count {cnt*1e3:6.2f}  nonzero {nz*1e3:6.2f}  per-elem hook {total/numel*1e9:6.2f} ns", flush=True)
