"""Replay a recorded run (AUTOCOMP_RECORD_WINDOWS) through a fresh planner (default policy,
window 50, warm-up 100, target 0.9), and at every boundary also ask the engine for two pinned
plans in the same measured context: rank 4 everywhere ({"*": "powersgd:rank=4"}) and the same
with every 1-D tensor pinned to none. Prints each one's predicted step, what its 1-D layers
add and the compression work in that, and rank 4 everywhere's predicted per-step value
1 - a E (a = error_cost over the matrices' weight). From the repository root:

  python docs/benchmarks-as-is-2026-11-29/replay_pinned.py WINDOWS.jsonl

At af09ea0 rank 4 everywhere priced the held-out GPT's 98 1-D tensors at 22 ms of work
(replay-before.txt); since 279adbe both plans are priced alike (those pins run as 'none').
"""
import json, sys
import torch
from autocomp.cost_model import HALF_DTYPES, load_regressor
from autocomp.opening import calibrate
from autocomp.planner import WindowPlanner
from autocomp.policy.rules import load_policy
from autocomp.window import WindowMeasurement

lines = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
first = next(line for line in lines if "measurement" in line)
shapes = {n: torch.Size(s) for n, s in first["shapes"].items()}
names = list(shapes)
one_d = [n for n, s in shapes.items() if len(s) < 2]
print(f"{len(names)} tensors, {len(one_d)} 1-D, {sum(shapes[n].numel() for n in one_d)} elements in those")
rules = load_policy("default")
planner = WindowPlanner(rules, names, shapes, dict.fromkeys(names, torch.float32), [],
    WindowPlanner.Config(target_overlap=0.9, window=50, warmup_steps=100), world_size=2)
calibrate(planner.cost_model, rules.candidates, 2, torch.device("cpu"))
load_regressor()
PLANS = {"psgd4": [("*", "powersgd:rank=4")],
         "psgd4-1d-none": [*((n, "none") for n in one_d), ("*", "powersgd:rank=4")]}
pinned, per_error = {}, [0.0]
decide = planner.engine.decide


def with_pinned(profiles, timing, step, world, **kw):
    layers = list(profiles.values()) if isinstance(profiles, dict) else list(profiles)
    per_error[0] = rules.error_cost / sum(planner.engine._weight(x) for x in layers if len(x.shape) >= 2)
    for label, pins in PLANS.items():
        pinned[label] = decide(profiles, timing, step, world, **dict(kw, pins=pins, locked={}))
    return decide(profiles, timing, step, world, **kw)


planner.engine.decide = with_pinned
for line in lines:
    if "opening" in line:
        o = line["opening"]
        planner.cost_model.update_contention(float(o["contention_seconds_per_byte"]))
        for dtype, cost in zip(HALF_DTYPES, o["half_sum_seconds_per_element"]):
            planner.cost_model.update_half_sum(dtype, cost)
        planner.row_shares = dict(o.get("row_shares", {}))
        continue
    m = WindowMeasurement.from_dict(line["measurement"])
    planner.decide(m, line["current"])
    out = [f"step {m.step:4d} measured {m.timings['step_seconds']:.4f} chosen {planner.last_decision.predicted_step_seconds:.4f}"]
    for label, p in pinned.items():
        layers = [x for x in p.layers if x.name in one_d]
        out.append(f"{label} {p.predicted_step_seconds:.4f} (1-D: {sum(x.predicted_seconds for x in layers) * 1e3:.2f} ms, "
                   f"work {sum(x.predicted_work_seconds for x in layers) * 1e3:.2f} ms)")
    out.append(f"rank 4 everywhere 1 - aE = {1 - per_error[0] * pinned['psgd4'].predicted_error:.3f}")
    print(" | ".join(out))
