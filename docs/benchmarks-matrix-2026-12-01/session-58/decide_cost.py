"""Time WindowPlanner.decide for models with N tensors (GPT-like blocks)."""
import sys, time, statistics
import torch
sys.path.insert(0, "/work/main/tests")
from autocomp.compressors import Collective
from autocomp.planner import WindowPlanner
from autocomp.policy import load_policy
from autocomp.window import LayerWindow, WindowMeasurement

def shapes_for(blocks, d=512):
    s = {"embed.weight": torch.Size([256, d]), "position": torch.Size([1, 64, d])}
    for b in range(blocks):
        p = f"blocks.{b}."
        s[p+"norm1.weight"] = torch.Size([d]); s[p+"norm1.bias"] = torch.Size([d])
        s[p+"attn.in_proj_weight"] = torch.Size([3*d, d]); s[p+"attn.in_proj_bias"] = torch.Size([3*d])
        s[p+"attn.out_proj.weight"] = torch.Size([d, d]); s[p+"attn.out_proj.bias"] = torch.Size([d])
        s[p+"norm2.weight"] = torch.Size([d]); s[p+"norm2.bias"] = torch.Size([d])
        s[p+"mlp.0.weight"] = torch.Size([4*d, d]); s[p+"mlp.0.bias"] = torch.Size([4*d])
        s[p+"mlp.2.weight"] = torch.Size([d, 4*d]); s[p+"mlp.2.bias"] = torch.Size([d])
    return s

def meas(step, shapes, mbit, compute=0.2, steps=10):
    names = list(shapes)
    raw = sum(s.numel()*4 for s in shapes.values())
    comm = raw/(mbit*1e6/8)
    layers = {n: LayerWindow(spec="none", grad_norm=1.0, residual_norm=0.0, rel_error=None, hook_seconds=0.0,
                             bucket=0, bucket_hideable_seconds=0.0, grad_l1=None) for n in names}
    t = {"step_seconds": compute+comm, "backward_seconds": 0.6*compute, "hideable_seconds": 0.0,
         "comm_busy_seconds": comm, "compress_seconds": 0.0, "exposed_seconds": comm}
    return WindowMeasurement(step=step, world_size=2, window_steps=steps, profiled_ranks=2, timings=t, loss=2.0,
                             layers=layers, busy_min=[comm]*steps, collectives=[[(Collective.ALL_REDUCE, raw, comm)]]*steps)

for blocks in [int(a) for a in sys.argv[1:]] or [1, 3, 6, 12, 24]:
    shapes = shapes_for(blocks)
    names = list(shapes)
    rules = load_policy("default")
    p = WindowPlanner(rules, names, shapes, dict.fromkeys(names, torch.float32), [],
                      WindowPlanner.Config(window=10, warmup_steps=0), world_size=2)
    current = dict.fromkeys(names, "none")
    times = []
    for w in range(6):
        m = meas(10*(w+1), shapes, mbit=50)
        t0 = time.perf_counter()
        upd = p.decide(m, current)
        times.append(time.perf_counter()-t0)
        if upd: 
            try: current = {**current, **(upd.plan if hasattr(upd,'plan') else {})}
            except Exception: pass
    print(f"blocks={blocks} tensors={len(names)} decide ms: " + " ".join(f"{t*1e3:.1f}" for t in times), flush=True)
