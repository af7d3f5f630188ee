"""Replay a recorded lstm-lm run (AUTOCOMP_RECORD_WINDOWS) through a fresh planner (the tta
defaults) and at every boundary also ask the engine for three pinned whole plans from the same
measured context: rank 4, rank 16 and fp16 everywhere. Prints each plan's predicted step, summed
option error, the per-step progress it is priced at (1 - a E) and its predicted progress per
second relative to rank 4 everywhere. Adapted from docs/benchmarks-static-2026-11-29/replay_plans.py.
  PYTHONPATH=<repo> python replay16.py lstm500-adaptive.jsonl   (from the repository root)"""
import json, os, sys
import torch
from autocomp.planner import WindowPlanner
from autocomp.window import WindowMeasurement
from autocomp.policy.rules import load_policy
from autocomp.opening import calibrate
from autocomp.cost_model import HALF_DTYPES, load_regressor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
grid = {'psgd16': {'*': 'powersgd:rank=16'}, 'psgd4': {'*': 'powersgd:rank=4'}, 'fp16': {'*': 'fp16'}}
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
first = next(l for l in lines if 'measurement' in l)
shapes = {n: torch.Size(s) for n, s in first['shapes'].items()}
names = list(shapes)
rules = load_policy('default')
import dataclasses
for key in ('error_cost', 'time_slack'):  # ERROR_COST=<x>, TIME_SLACK=<x>: the default preset otherwise
    if os.environ.get(key.upper()):
        rules = dataclasses.replace(rules, **{key: float(os.environ[key.upper()])})
        print(key, getattr(rules, key))
planner = WindowPlanner(rules, names, shapes, dict.fromkeys(names, torch.float32), [],
    WindowPlanner.Config(target_overlap=0.9, window=50, warmup_steps=100), world_size=2)
calibrate(planner.cost_model, rules.candidates, 2, torch.device('cpu'))
load_regressor()

preds = {}
_orig = planner.engine.decide
per_error = [0.0]
def _wrapped(profiles, timing, step, world, **kw):
    layers = list(profiles.values()) if isinstance(profiles, dict) else list(profiles)
    # the search weighs the layers it solves (matrices; 1-D tensors are rule-decided)
    per_error[0] = rules.error_cost / sum(planner.engine._weight(x) for x in layers if len(x.shape) >= 2)
    for name in os.environ.get('PINNED', 'psgd4,psgd16,fp16').split(','):  # PINNED: plans of paired_steps.PLANS
        kw2 = dict(kw); kw2['pins'] = list(grid[name].items()); kw2['locked'] = {}
        preds[name] = _orig(profiles, timing, step, world, **kw2)
    return _orig(profiles, timing, step, world, **kw)
planner.engine.decide = _wrapped

for l in lines:
    if 'opening' in l:
        o = l['opening']
        import os; planner.cost_model.update_contention(float(os.environ.get('CONT') or o['contention_seconds_per_byte']))
        for dt, c in zip(HALF_DTYPES, o['half_sum_seconds_per_element']):
            planner.cost_model.update_half_sum(dt, c)
        planner.row_shares = dict(o.get('row_shares', {}))
        print('opening contention', o['contention_seconds_per_byte'])
        continue
    m = WindowMeasurement.from_dict(l['measurement'])
    current = l['current']
    preds.clear()
    u = planner.decide(m, current)
    d = planner.last_decision
    rec = l['decision']
    t = m.timings
    a = per_error[0]
    rate = lambda x: (1 - a * x.predicted_error) / x.predicted_step_seconds
    print(f"step {m.step:4d} measured step {t['step_seconds']:.4f} | chosen ({d.solver}) {d.predicted_step_seconds:.4f} s E {d.predicted_error:.4f} progress/s {rate(d) / rate(preds['psgd4']) - 1:+.2%} on psgd4"
          f" | fastest {d.fastest_step_seconds or 0:.4f}")
    for name, p in preds.items():
        print(f"    pinned {name}: {p.predicted_step_seconds:.4f} s ({p.predicted_step_seconds / preds['psgd4'].predicted_step_seconds - 1:+.2%} on psgd4), E {p.predicted_error:.4f}, per step 1 - aE = {1 - a * p.predicted_error:.3f}, progress/s {rate(p) / rate(preds['psgd4']) - 1:+.2%} on psgd4")
    print("    chosen, not rank 4:", {x.name: x.spec[:12] for x in d.layers if not x.spec.startswith(('powersgd:rank=4', 'none'))})
