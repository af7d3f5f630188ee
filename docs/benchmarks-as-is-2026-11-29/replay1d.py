"""At each boundary of a recorded run: the engine's price for 1-D tensors on PowerSGD's copy
path (pinned {"*": powersgd:rank=4}) against the same plan with 1-D tensors on none.
Run from the repository root:
  .venv/bin/python docs/benchmarks-as-is-2026-11-29/replay1d.py \
      docs/benchmarks-contention-2026-11-28/windows-adaptive2.jsonl
Since effective_compressor the two plans are priced alike (the pinned 1-D layers are 'none')."""
import json, os, sys
import torch
from autocomp.planner import WindowPlanner
from autocomp.window import WindowMeasurement
from autocomp.policy.rules import load_policy
from autocomp.opening import calibrate
from autocomp.cost_model import HALF_DTYPES, load_regressor
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
first = next(l for l in lines if 'measurement' in l)
shapes = {n: torch.Size(s) for n, s in first['shapes'].items()}
names = list(shapes)
oned = [n for n, s in shapes.items() if len(s) < 2]
print(len(names), "tensors,", len(oned), "1-D, numel", sum(shapes[n].numel() for n in oned))
rules = load_policy('default')
planner = WindowPlanner(rules, names, shapes, dict.fromkeys(names, torch.float32), [],
    WindowPlanner.Config(target_overlap=0.9, window=50, warmup_steps=100), world_size=2)
calibrate(planner.cost_model, rules.candidates, 2, torch.device('cpu'))
load_regressor()
plans = {"psgd4": [("*", "powersgd:rank=4")],
         "psgd4-1d-none": [*((n, "none") for n in oned), ("*", "powersgd:rank=4")]}
preds = {}
_orig = planner.engine.decide
def _wrapped(profiles, timing, step, world, **kw):
    for name, pins in plans.items():
        kw2 = dict(kw); kw2['pins'] = pins; kw2['locked'] = {}
        preds[name] = _orig(profiles, timing, step, world, **kw2)
    return _orig(profiles, timing, step, world, **kw)
planner.engine.decide = _wrapped
for l in lines:
    if 'opening' in l:
        o = l['opening']
        planner.cost_model.update_contention(float(o['contention_seconds_per_byte']))
        for dt, c in zip(HALF_DTYPES, o['half_sum_seconds_per_element']):
            planner.cost_model.update_half_sum(dt, c)
        planner.row_shares = dict(o.get('row_shares', {}))
        continue
    m = WindowMeasurement.from_dict(l['measurement'])
    preds.clear()
    planner.decide(m, l['current'])
    d = planner.last_decision
    out = [f"step {m.step:4d} measured {m.timings['step_seconds']:.4f} chosen {d.predicted_step_seconds:.4f}"]
    for name, p in preds.items():
        one = [x for x in p.layers if x.name in oned]
        out.append(f"{name} {p.predicted_step_seconds:.4f} (1-D: sum {sum(x.predicted_seconds for x in one)*1e3:.2f} ms, work {sum(x.predicted_work_seconds for x in one)*1e3:.2f} ms, specs {sorted({x.spec for x in one})})")
    print(" | ".join(out))
