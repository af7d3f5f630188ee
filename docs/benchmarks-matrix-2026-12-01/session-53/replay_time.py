"""Replay a recording (AUTOCOMP_RECORD_WINDOWS) through a fresh planner and time each decide
(the tta defaults: default policy, window 50, warm-up 100, target 0.9). Each window is decided
from the plan the recorded run held (its 'current'), so old and new code see the same inputs.
Prints per-decision ms, the median and total, and the cost model's fits.
  PYTHONPATH=<tree> python replay_time.py REC.jsonl [ROUNDS]"""
import json, statistics, sys, time, gc
import torch
from autocomp.planner import WindowPlanner
from autocomp.window import WindowMeasurement
from autocomp.policy.rules import load_policy
from autocomp.cost_model import HALF_DTYPES, load_regressor

import gzip
opener = gzip.open if sys.argv[1].endswith('.gz') else open
lines = [json.loads(l) for l in opener(sys.argv[1], 'rt') if l.strip()]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
first = next(l for l in lines if 'measurement' in l)
shapes = {n: torch.Size(s) for n, s in first['shapes'].items()}
names = list(shapes)
load_regressor()
for r in range(rounds):
    rules = load_policy('default')
    planner = WindowPlanner(rules, names, shapes, dict.fromkeys(names, torch.float32), [],
        WindowPlanner.Config(target_overlap=0.9, window=50, warmup_steps=100), world_size=2)
    fits = [0]
    fit = planner.cost_model.fit
    def counted():
        fits[0] += 1
        return fit()
    planner.cost_model.fit = counted
    times, plans = [], []
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
        gc.collect()
        t = time.perf_counter()
        u = planner.decide(m, l['current'])
        times.append(time.perf_counter() - t)
        plans.append(tuple(u.plan))
    print(f"round {r}: {len(times)} decisions, median {statistics.median(times)*1e3:.1f} ms, total {sum(times):.3f} s, fits {fits[0]}")
    import os
    if os.environ.get("PLANS_OUT"):
        json.dump([list(p) for p in plans], open(os.environ["PLANS_OUT"] + f".{r}", "w"))
    print("  per decision ms:", " ".join(f"{x*1e3:.0f}" for x in times))
