"""PowerSGD's own path for 1-D tensors, timed as the compressor benchmark replays the hook's
per-layer work (no collective); minimum and median over 350 interleaved rounds.
Run from the repository root: .venv/bin/python docs/benchmarks-as-is-2026-11-29/copypath2.py"""
import statistics, torch
from autocomp.compressors import build_compressor
from autocomp_bench.compressor_cost import _HookStep, gradient_like
torch.set_num_threads(2)
c = build_compressor("powersgd:rank=4")
sizes = (64, 256, 1024, 4096, 16384, 65536, 262144)
hooks = {n: (_HookStep(c, torch.Size((n,)), 0), gradient_like(torch.Size((n,)), 0)) for n in sizes}
loc = {n: [] for n in sizes}; dec = {n: [] for n in sizes}
for r in range(400):  # interleaved round-robin
    for n in sizes:
        h, g = hooks[n]
        parts, _ = h.run(g, r)
        if r >= 50:
            loc[n].append(parts["prepare"] + parts["compress"] + parts["ef_decompress"] + parts["ef_subtract"] + parts["commit"])
            dec[n].append(parts["decode"])
for n in sizes:
    print(f"{n:7d} local min {min(loc[n])*1e6:7.2f} med {statistics.median(loc[n])*1e6:7.2f} | decode min {min(dec[n])*1e6:6.2f} med {statistics.median(dec[n])*1e6:6.2f} us")
