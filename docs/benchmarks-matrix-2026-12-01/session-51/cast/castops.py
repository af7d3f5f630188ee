"""Each pass of autocomp's fp16 path on one task's gradients, summed over its tensors, per step
(one thread, no collectives).  python castops.py TASK"""
import statistics, sys, time
import torch
from autocomp_bench.tasks import build_task
torch.set_num_threads(1)
grads = [torch.randn(p.shape).reshape(-1) * 1e-3 for p in build_task(sys.argv[1]).build_model().parameters()]
lim = torch.finfo(torch.float16).max
half = [g.to(torch.float16) for g in grads]
flat = torch.cat(half)
outs = [torch.empty_like(g) for g in grads]
def views():
    s = 0
    for g in grads:
        yield flat[s:s + g.numel()]; s += g.numel()
ops = {
    "cast to fp16": lambda: [g.to(torch.float16) for g in grads],
    "clamp_ (fp16)": lambda: [h.clamp_(-lim, lim) for h in half],
    "input sum (fp32)": lambda: [g.sum(dtype=torch.float32) for g in grads],
    "NaN marker add_": lambda: [h[:1].add_((t - t).to(h.dtype)) for h, t in zip(half, [g[:1].sum() for g in grads])],
    "torch.cat (group)": lambda: torch.cat(half),
    "decode copy_": lambda: [o.copy_(v) for o, v in zip(outs, views())],
    "decoded sum + isfinite": lambda: [torch.isfinite(o.sum(dtype=torch.float32)) for o in outs],
}
total = 0.0
for name, fn in ops.items():
    for _ in range(10): fn()
    ts = []
    for _ in range(100):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    m = statistics.median(ts) * 1e3; total += m
    print(f"{sys.argv[1]:10s} {name:24s} {m:.3f} ms")
print(f"{sys.argv[1]:10s} {'sum of the passes':24s} {total:.3f} ms ({len(grads)} tensors)")
