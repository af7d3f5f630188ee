import math, torch, time, sys
import torch.distributed as dist
from autocomp.compressors import build_compressor, Collective
from autocomp.hook_layer import LayerReplay
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
shapes = [(1024,1024),(131072,64)]
specs = ["fp16:ef=false","powersgd:rank=4,ef=true","topk:ratio=0.01,ef=true","int8:chunk=256,ef=true"]
def timeit(spec, shp):
    g = torch.Generator().manual_seed(0)
    c = build_compressor(spec)
    grad = torch.randn(shp, generator=g) * 1e-3
    r = LayerReplay(c, grad, gathered=2)
    best = math.inf
    for _ in range(3):
        local, decode = r.step()
        best = min(best, local + decode * (2 if c.collective is Collective.ALL_GATHER else 1))
    return best * 1e3 / (grad.numel() / 2**20)
for rnd in range(2):
  for mode in ("alone", "both"):
    out = []
    for spec in specs:
        for shp in shapes:
            dist.barrier()
            if rank == 0 or mode == "both":
                v = timeit(spec, shp)
            else:
                v = 0.0
            out.append(f"{spec.split(':')[0]}{shp[0]}:{v:.2f}")
    print(rank, mode, " ".join(out), flush=True)
dist.destroy_process_group()
