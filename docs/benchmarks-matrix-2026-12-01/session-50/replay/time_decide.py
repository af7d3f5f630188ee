"""Time WindowPlanner.decide on each recorded window (the tta defaults), one thread."""
import json, sys, time
import torch
from autocomp.planner import WindowPlanner
from autocomp.window import WindowMeasurement
from autocomp.policy.rules import load_policy
from autocomp.opening import calibrate
from autocomp.cost_model import HALF_DTYPES, load_regressor
torch.set_num_threads(1)
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
first = next(l for l in lines if 'measurement' in l)
shapes = {n: torch.Size(s) for n, s in first['shapes'].items()}
names = list(shapes)
rules = load_policy('default')
planner = WindowPlanner(rules, names, shapes, dict.fromkeys(names, torch.float32), [],
    WindowPlanner.Config(target_overlap=0.9, window=50, warmup_steps=100), world_size=2)
calibrate(planner.cost_model, rules.candidates, 2, torch.device('cpu'))
load_regressor()
total = 0.0
for l in lines:
    if 'opening' in l:
        o = l['opening']
        planner.cost_model.update_contention(o['contention_seconds_per_byte'])
        for dt, c in zip(HALF_DTYPES, o['half_sum_seconds_per_element']):
            planner.cost_model.update_half_sum(dt, c)
        planner.row_shares = dict(o.get('row_shares', {}))
        continue
    m = WindowMeasurement.from_dict(l['measurement'])
    t0 = time.perf_counter()
    planner.decide(m, l['current'])
    dt = time.perf_counter() - t0
    total += dt
    print(f"step {m.step:4d} decide {dt*1000:7.1f} ms  solver {planner.last_decision.solver}")
print(f"total {total:.3f} s")
