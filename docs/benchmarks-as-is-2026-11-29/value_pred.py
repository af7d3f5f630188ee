"""The engine's predicted per-step value of rank 4 everywhere (1 - a E, pinned {"*": rank 4})
at each boundary of a recorded run, from the same measured context. From the repository root:
  .venv/bin/python docs/benchmarks-as-is-2026-11-29/value_pred.py WINDOWS.jsonl"""
import json, sys, torch
from autocomp.planner import WindowPlanner
from autocomp.window import WindowMeasurement
from autocomp.policy.rules import load_policy
from autocomp.opening import calibrate
from autocomp.cost_model import HALF_DTYPES, load_regressor
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
first = next(l for l in lines if 'measurement' in l)
shapes = {n: torch.Size(s) for n, s in first['shapes'].items()}
names = list(shapes)
rules = load_policy('default')
planner = WindowPlanner(rules, names, shapes, dict.fromkeys(names, torch.float32), [],
    WindowPlanner.Config(target_overlap=0.9, window=50, warmup_steps=100), world_size=2)
calibrate(planner.cost_model, rules.candidates, 2, torch.device('cpu'))
load_regressor()
pred = {}
_orig = planner.engine.decide
def _wrapped(profiles, timing, step, world, **kw):
    layers = list(profiles.values()) if isinstance(profiles, dict) else list(profiles)
    pred['a'] = rules.error_cost / sum(planner.engine._weight(x) for x in layers if len(x.shape) >= 2)
    kw2 = dict(kw); kw2['pins'] = [("*", "powersgd:rank=4")]; kw2['locked'] = {}
    pred['psgd4'] = _orig(profiles, timing, step, world, **kw2)
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
    planner.decide(m, l['current'])
    p = pred['psgd4']
    print(f"step {m.step:4d}: rank 4 everywhere 1 - aE = {1 - pred['a'] * p.predicted_error:.3f}")
