"""Replay captured decisions; at each, print the chosen plan's predicted step and progress
rate, and the same for the plan with one layer swapped to another option.
    python swap.py CAP.pkl"""
import pickle, sys
import autocomp.policy.search as S
captured = pickle.load(open(sys.argv[1], "rb"))
orig = S.search
seen = {}
def wrapped(pending, groups, fixed, timing, config, reference=None):
    res = orig(pending, groups, fixed, timing, config, reference)
    prob = S._Problem(pending, groups, fixed.copy())
    per = config.progress_per_error
    chosen = list(res.chosen)
    base = timing.base
    def show(label, plan):
        step = base + prob.timeline(plan).added_s
        r = S.rate(prob, plan, base, per)
        E = sum(o.error for o in plan)
        return f"{label:28s} step {step*1e3:6.2f} ms  1-aE {1-per*E:.4f}  rate {r:.3f}"
    lines = [show("chosen", chosen)]
    for i, p in enumerate(pending):
        cur = chosen[i]
        name = p.layer.name
        opts = {o.key: o for o in p.options}
        lines.append(f"   {name}: chosen {cur.key} {cur.seconds*1e3:.2f} ms relerr {p.rel_errors.get(cur.key, 0):.3f} err {cur.error*per:.4f}; options " + ", ".join(f"{k.split(',')[0]} {o.seconds*1e3:.2f}ms re{p.rel_errors.get(k,0):.3f} e{o.error*per:.4f}" for k, o in opts.items()))
        for k, o in opts.items():
            if k != cur.key and ("rank=16" in k or k.startswith("fp16")):
                alt = chosen.copy(); alt[i] = o
                lines.append("      " + show(f"{name.split('.')[-1]}->{k.split(',')[0]}", alt))
    seen["lines"] = lines
    return res
import autocomp.policy.engine
for name in dir(autocomp.policy.engine):
    if getattr(autocomp.policy.engine, name) is orig:
        setattr(autocomp.policy.engine, name, wrapped)
for blob, _, plan, step in captured:
    if step < int(sys.argv[2]) if len(sys.argv) > 2 else step < 100:
        continue
    engine, a, k = pickle.loads(blob)
    seen.clear()
    d = engine.decide(*a, **k)
    print(f"step {step} {d.solver}: pred {d.predicted_step_seconds} fastest {d.fastest_step_seconds}")
    for l in seen.get("lines", []):
        print("  ", l)
