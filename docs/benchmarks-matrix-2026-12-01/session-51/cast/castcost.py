"""Per-step CPU cost of autocomp's fp16 path on every gradient of a task's model, layer by layer
(the hook's own encode: autocomp.hook_layer.begin_encoding, the group's torch.cat, then
decode_into per layer), against one bucket-wide cast as PyTorch's fp16_compress_hook does
(to(fp16), scale, copy back). No collectives; one thread.  python castcost.py TASK"""
import statistics, sys, time
import torch
from autocomp.compressors import build_compressor
from autocomp.hook_layer import LayerSlot, begin_encoding, decode_into
from autocomp.hook_layer import _ReplayHookState
from autocomp_bench.tasks import build_task
torch.set_num_threads(1)
model = build_task(sys.argv[1]).build_model()
grads = [torch.randn(p.shape) * 1e-3 for p in model.parameters()]
numel = sum(g.numel() for g in grads)
bucket = torch.cat([g.reshape(-1) for g in grads])
comp = build_compressor("fp16:ef=false")
import inspect

slots = [LayerSlot(f"p{i}", g.shape, g.dtype, i, comp) for i, g in enumerate(grads)]
state = _ReplayHookState()
offsets, o = [], 0
for g in grads:
    offsets.append(o); o += g.numel()

def per_layer():
    parts = []
    for slot, off in zip(slots, offsets):
        enc = begin_encoding(slot, bucket[off:off + slot.numel], state)
        parts.append(enc.payload.reshape(-1))
    flat = torch.cat(parts)  # the hook's _flat for the group's all-reduce
    checks, start = [], 0
    for slot, off in zip(slots, offsets):
        n = slot.numel
        checks.append(decode_into(slot, flat[start:start + n], bucket[off:off + n]))
        start += n
    torch.stack(checks).all()  # resolve_nonfinite's one read

def bucket_wide():
    flat = bucket.to(torch.float16).mul_(0.5)
    bucket.copy_(flat)

for name, fn in (("per-layer (autocomp)", per_layer), ("bucket-wide (PyTorch hook)", bucket_wide)):
    for _ in range(20): fn()
    ts = []
    for _ in range(200):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    print(f"{sys.argv[1]}: {len(grads)} tensors, {numel} elements: {name} {statistics.median(ts)*1e3:.3f} ms")
