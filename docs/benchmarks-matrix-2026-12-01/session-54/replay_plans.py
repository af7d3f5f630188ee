"""Replay every recording listed in argv[1] through a fresh planner (replay_time.py's setup)
and dump each decision's plan, for an old/new comparison: python replay_plans.py LIST OUT.json"""
import gzip, json, sys, time
import torch
from autocomp.planner import WindowPlanner
from autocomp.window import WindowMeasurement
from autocomp.policy.rules import load_policy
from autocomp.cost_model import HALF_DTYPES, load_regressor

load_regressor()
out = {}
for path in [l.split()[0] for l in open(sys.argv[1]) if l.strip()]:
    opener = gzip.open if path.endswith('.gz') else open
    try:
        lines = [json.loads(l) for l in opener(path, 'rt') if l.strip()]
        first = next(l for l in lines if 'measurement' in l and 'shapes' in l)
        shapes = {n: torch.Size(s) for n, s in first['shapes'].items()}
        names = list(shapes)
        planner = WindowPlanner(load_policy('default'), names, shapes,
            dict.fromkeys(names, torch.float32), [],
            WindowPlanner.Config(target_overlap=0.9, window=50, warmup_steps=100), world_size=2)
        plans, total = [], 0.0
        for l in lines:
            if 'opening' in l:
                o = l['opening']
                planner.cost_model.update_contention(float(o['contention_seconds_per_byte']))
                for dt, c in zip(HALF_DTYPES, o['half_sum_seconds_per_element']):
                    planner.cost_model.update_half_sum(dt, c)
                planner.row_shares = dict(o.get('row_shares', {}))
                continue
            if 'measurement' not in l:
                continue
            m = WindowMeasurement.from_dict(l['measurement'])
            t = time.perf_counter()
            u = planner.decide(m, l['current'])
            total += time.perf_counter() - t
            plans.append(list(u.plan))
        out[path] = {"plans": plans, "seconds": total}
    except Exception as exc:  # a recording of an older format
        out[path] = {"error": repr(exc)[:200]}
json.dump(out, open(sys.argv[2], 'w'))
ok = [p for p in out if 'plans' in out[p]]
print(f"{len(ok)} of {len(out)} recordings replayed, {sum(len(out[p]['plans']) for p in ok)} decisions, {sum(out[p]['seconds'] for p in ok):.2f} s deciding")
