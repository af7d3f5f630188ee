"""Single-thread timing of the fp16 (ef=false) hook path's passes on the n-gram table's size,
against PyTorch's fp16_compress_hook's passes (no collective)."""
import statistics, sys, time
import torch
torch.set_num_threads(1)
n = 8_519_680 if len(sys.argv) < 2 else int(sys.argv[1])
g = torch.randn(n)
L = torch.finfo(torch.float16).max
def t(f, reps=15):
    f(); out = []
    for _ in range(reps):
        s = time.perf_counter(); f(); out.append(time.perf_counter() - s)
    return statistics.median(out) * 1e3
buf = g.clone(); half = g.half(); tgt = torch.empty_like(g)
rows = {
  "mul_ fp32 (average_in_place)": lambda: buf.mul_(0.5),
  "to fp16": lambda: buf.to(torch.float16),
  "clamp_ fp16": lambda: half.clamp_(-L, L),
  "sum fp32 (inf sentinel)": lambda: buf.sum(dtype=torch.float32),
  "cat [fp16] (_flat copy)": lambda: torch.cat([half]),
  "copy_ fp16->fp32 (decode)": lambda: tgt.copy_(half),
  "sum fp32 target (finite check)": lambda: tgt.sum(dtype=torch.float32),
  "div_ fp16 (torch hook)": lambda: half.div_(1.0),
}
for k, f in rows.items():
    print(f"{k:34s} {t(f):7.2f} ms")
from autocomp.compressors import build_compressor
from autocomp.hook_layer import LayerReplay
rep = LayerReplay(build_compressor("fp16:ef=false"), g.clone())
print(f"{'LayerReplay fp16:ef=false':34s} {t(lambda: rep.step()):7.2f} ms")
def torch_path():
    c = buf.to(torch.float16).div_(2)
    tgt.copy_(c)
print(f"{'torch fp16 hook (no collective)':34s} {t(torch_path):7.2f} ms")
