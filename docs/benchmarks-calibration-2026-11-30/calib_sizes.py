import math, torch, time
from autocomp.compressors import build_compressor, Collective
from autocomp.hook_layer import LayerReplay
from autocomp.cost_prior import prior_seconds
torch.set_num_threads(1)
shapes = [(1024,1024),(2048,1024),(131072,64),(4096,4096)]
specs = ["fp16:ef=false","powersgd:rank=4,ef=true","topk:ratio=0.01,ef=true","int8:chunk=256,ef=true"]
g = torch.Generator().manual_seed(0)
for spec in specs:
    c = build_compressor(spec)
    row = []
    base = None
    for shp in shapes:
        grad = torch.randn(shp, generator=g) * 1e-3
        r = LayerReplay(c, grad, gathered=2)
        best = math.inf
        for _ in range(4):
            local, decode = r.step()
            best = min(best, local + decode * (2 if c.collective is Collective.ALL_GATHER else 1))
        n = grad.numel() / 2**20
        pr = prior_seconds(c, torch.Size(shp), 2)
        per = best*1e3/n
        if base is None: base = (per, pr*1e3/n)
        row.append(f"{shp}: {per:.2f} ms/M (x{per/base[0]:.2f}; prior x{pr*1e3/n/base[1]:.2f})")
    print(spec, " | ".join(row), flush=True)
