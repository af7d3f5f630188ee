# Replay a recorded run's windows through fresh planners with policy variants; print each
# decision's plan (non-rank-4 layers), predicted step, fastest step, solver.
import dataclasses, json, sys
import torch
from autocomp.planner import WindowPlanner
from autocomp.policy.rules import load_policy
from autocomp.window import WindowMeasurement

path = sys.argv[1]
variants = json.loads(sys.argv[2]) if len(sys.argv) > 2 else [{}]
lines = [json.loads(l) for l in open(path) if l.strip()]
wins = [l for l in lines if "measurement" in l]
shapes = {n: torch.Size(s) for n, s in wins[0]["shapes"].items()}
names = list(shapes)
for var in variants:
    rules = dataclasses.replace(load_policy("default"), **var)
    planner = WindowPlanner(rules, names, shapes, dict.fromkeys(names, torch.float32), [],
                            WindowPlanner.Config(window=50, warmup_steps=2),
                            world_size=WindowMeasurement.from_dict(wins[0]["measurement"]).world_size)
    print("==", var)
    op = next(l["opening"] for l in lines if "opening" in l)
    contention = float(__import__("os").environ.get("CONTENTION", op["contention_seconds_per_byte"]))
    planner.cost_model.update_contention(contention)
    u = planner.open(tuple(op["probe"]), op["forward_seconds"], 2, dict(wins[0]["current"]))
    print("  opening", u.plan if u else None)
    for w in wins:
        u = planner.decide(WindowMeasurement.from_dict(w["measurement"]), dict(w["current"]))
        if u is None or u.record is None:
            print("  no decision"); continue
        d = u.record.decision
        odd = {l["name"]: l["spec"] for l in d["layers"] if not l["spec"].startswith("powersgd:rank=4") and l["spec"] != "none"}
        print(f"  step {d['step']} {d['solver']:10s} pred {d['predicted_step_seconds']:.4f} fastest {d['fastest_step_seconds']:.4f} err {d['predicted_error']:.0f} {odd}")
