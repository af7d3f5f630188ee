# Scratch check (docs/benchmarks.md, twenty-first session): replay a recorded gpt run's
# windows through a fresh planner, then price fixed plans on its last measurement by pinning
# every layer (operator pins) on a copy of the planner. Run from the repo root.
import copy, json, sys
import torch
from autocomp.planner import WindowPlanner
from autocomp.policy.rules import load_policy
from autocomp.window import WindowMeasurement

path = sys.argv[1]
lines = [json.loads(l) for l in open(path) if l.strip()]
opening = next((l for l in lines if "opening" in l), None)
wins = [l for l in lines if "measurement" in l]
shapes = {n: torch.Size(s) for n, s in wins[0]["shapes"].items()}
names = list(shapes)
def build():
    planner = WindowPlanner(load_policy("default"), names, shapes, dict.fromkeys(names, torch.float32), [],
                            WindowPlanner.Config(window=50, warmup_steps=100),
                            world_size=WindowMeasurement.from_dict(wins[0]["measurement"]).world_size)
    for w in wins[:-1]:
        planner.decide(WindowMeasurement.from_dict(w["measurement"]), dict(w["current"]))
    return planner
last = wins[-1]
base_current = dict(last["current"])

def price(label, plan):
    p = build()
    p.operator_pins = [(n, s) for n, s in plan.items()]
    u = p.decide(WindowMeasurement.from_dict(last["measurement"]), dict(base_current))
    d = u.record.decision
    print(f"{label:34s} step {d['predicted_step_seconds']:.4f} compute {d['compute_seconds']:.4f} sync {d['sync_seconds']:.4f} exposed {d['predicted_exposed_seconds']:.4f} comm {d['predicted_comm_seconds']:.4f}")
    return d

r4 = {n: ("powersgd:rank=4" if len(s) == 2 and min(s) > 4 else "none") for n, s in shapes.items()}
price("rank 4 everywhere", r4)
proj = [n for n in names if n.endswith("out_proj.weight")]
price("int8 on the 3 projections", {**r4, **{n: "int8:chunk=256" for n in proj}})
price("fp16 on the 3 projections", {**r4, **{n: "fp16:ef=false" for n in proj}})
price("int8 on blocks.2.mlp.2", {**r4, "blocks.2.mlp.2.weight": "int8:chunk=256"})
price("fp16 on blocks.2.mlp.*", {**r4, "blocks.2.mlp.0.weight": "fp16:ef=false", "blocks.2.mlp.2.weight": "fp16:ef=false"})
price("row50 final plan", {**r4, **{n: "int8:chunk=256" for n in proj}, "blocks.2.mlp.2.weight": "int8:chunk=256"})
