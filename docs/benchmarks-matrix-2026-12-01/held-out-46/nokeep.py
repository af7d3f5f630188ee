"""For each captured decision: the live result, and the fresh search without the keep."""
import copy, pickle, sys
import autocomp.policy.search as S
import autocomp.policy.engine as E
captured = pickle.load(open(sys.argv[1], "rb"))
orig = S.search
info = {}
def wrapped(pending, groups, fixed, timing, config, reference=None):
    fresh_pending = copy.deepcopy(list(pending))
    for p in fresh_pending:
        p.current = None
    fresh = orig(fresh_pending, groups, fixed.copy(), timing, config, reference)
    res = orig(pending, groups, fixed, timing, config, reference)
    if res.method == "kept":
        prob = S._Problem(pending, groups, fixed.copy())
        per = config.progress_per_error
        cur = [p.option(p.current) for p in pending]
        new = [next(o for o in p.options if o.key == c.key) for p, c in zip(pending, fresh.chosen)]
        rc, rn = S.rate(prob, cur, timing.base, per), S.rate(prob, new, timing.base, per)
        info.setdefault("kept", []).append((res.kept_because, fresh.method, timing.base + res.timeline.added_s, timing.base + fresh.timeline.added_s, timing.base + res.fastest_added, rc, rn,
             [(p.key if hasattr(p,'key') else None, c.key, n.key) for p, c, n in zip(pending, cur, new) if c.key != n.key]))
    return res

import autocomp.policy.engine
for name in dir(autocomp.policy.engine):
    if getattr(autocomp.policy.engine, name) is orig:
        setattr(autocomp.policy.engine, name, wrapped)
for blob, _, plan, step in captured:
    engine, a, k = pickle.loads(blob)
    info.clear()
    d = engine.decide(*a, **k)
    print(f"step {step} {d.solver}: pred {d.predicted_step_seconds*1e3:.1f} fastest {d.fastest_step_seconds*1e3:.1f}")
    for kb, fm, pc, pn, star, rc, rn, diffs in info.get("kept", []):
        print(f"   kept ({kb}): current {pc*1e3:.1f} ms ({pc/star-1:+.1%} over T*), fresh {fm} {pn*1e3:.1f} ms; progress/s current/new {rc/rn:.4f}; diffs {diffs}")
