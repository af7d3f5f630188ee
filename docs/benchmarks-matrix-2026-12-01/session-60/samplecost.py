"""Per-step hook work on the digits ViT's tensors, sampled vs not (encode_locally + decode_into)."""
import statistics, time, sys
import torch
torch.set_num_threads(1)
from autocomp_bench.tasks import build_task
from autocomp.compressors import build_compressor
from autocomp.hook_layer import LayerSlot, encode_locally, decode_into, _ReplayHookState
from autocomp.profiler import StepProfiler

task = build_task(sys.argv[1] if len(sys.argv) > 1 else "digits-vit")
model = task.build_model()
params = [(n, p) for n, p in model.named_parameters()]
def run(spec_for, sample, sketch, steps=30):
    slots = []
    for i, (n, p) in enumerate(params):
        c = build_compressor(spec_for(n, p))
        s = LayerSlot(n, p.shape, p.dtype, i, c)
        s.state = c.init_state(p.shape, i, 0)
        slots.append((s, torch.randn(p.numel()) * 1e-3, torch.empty(p.numel())))
    class St: pass
    st = St(); st.check_wire_bytes = False; st.step = 0
    prof = StepProfiler()
    st.profiler = prof
    st.sketch_errors = sketch
    times = []
    for k in range(steps):
        prof.begin_step(sample=sample)
        prof._samples.clear()
        t = time.perf_counter()
        for s, g, tgt in slots:
            payload, _ = encode_locally(s, g, st)
            bool(decode_into(s, payload, tgt))
        times.append(time.perf_counter() - t)
        st.step += 1
    return statistics.median(times[5:]) * 1e3
fp16 = lambda n, p: "fp16:ef=false"
none = lambda n, p: "none"
def mixed(n, p):
    return "powersgd:rank=16,ef=true" if p.dim() == 2 and min(p.shape) >= 64 else "fp16:ef=false"
for name, f in (("none", none), ("fp16", fp16), ("psgd16-mats+fp16", mixed)):
    print(f"{name:18s} not sampled {run(f, False, False):6.2f} ms  sampled {run(f, True, False):6.2f} ms  sampled+sketch {run(f, True, True):6.2f} ms")
