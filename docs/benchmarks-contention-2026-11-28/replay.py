"""Replay a recorded run (AUTOCOMP_RECORD_WINDOWS) through a fresh planner (default policy,
window 50, warm-up 100, target 0.9: the tta defaults); at every boundary also ask the engine
for two pinned plans of pinned-grid.json (rank 4 everywhere, and s4plan) from the same
measured context. CONT=<seconds per byte> replaces the opening's contention reading.
The cost model is calibrated afresh on this machine, so the first decisions can differ a
little from the recorded ones (rec_pred against replay_pred).
  PYTHONPATH=<repo> python replay.py windows-adaptive2.jsonl   (from the repository root)"""
import copy, json, sys
import torch
from autocomp.planner import WindowPlanner
from autocomp.window import WindowMeasurement
from autocomp.policy.rules import load_policy
from autocomp.opening import calibrate
from autocomp.cost_model import HALF_DTYPES, load_regressor

grid = json.load(open('docs/benchmarks-heldout-2026-11-28b/pinned-grid.json'))
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
first = next(l for l in lines if 'measurement' in l)
shapes = {n: torch.Size(s) for n, s in first['shapes'].items()}
names = list(shapes)
rules = load_policy('default')
planner = WindowPlanner(rules, names, shapes, dict.fromkeys(names, torch.float32), [],
    WindowPlanner.Config(target_overlap=0.9, window=50, warmup_steps=100), world_size=2)
calibrate(planner.cost_model, rules.candidates, 2, torch.device('cpu'))
load_regressor()

preds = {}
_orig = planner.engine.decide
def _wrapped(profiles, timing, step, world, **kw):
    for name in ('psgd4', 's4plan'):
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
    print(f"step {m.step:4d} rec_pred {rec.get('predicted_step_seconds') or 0:.4f} replay_pred {d.predicted_step_seconds:.4f} "
          f"psgd4 {preds['psgd4'].predicted_step_seconds if preds else 0:.4f} s4plan {preds['s4plan'].predicted_step_seconds if preds else 0:.4f} fast {d.fastest_step_seconds or 0:.4f} step {t['step_seconds']:.4f} hide {t['hideable_seconds']:.4f} busy {t['comm_busy_seconds']:.4f}")
    nones = [(n[7:], s[:6]) for n, s in zip(names, u.plan) if not s.startswith('powersgd:rank=4') and len(shapes[n]) > 1 and n.startswith('blocks.1')]
    print('   replay blocks.1x not rank 4:', nones, '| recorded:', [(x['name'][7:], x['spec'][:6]) for x in rec['layers'] if not x['spec'].startswith('powersgd:rank=4') and len(shapes[x['name']]) > 1 and x['name'].startswith('blocks.1')], '| solver', rec.get('solver'), d.solver if hasattr(d,'solver') else '')
