"""Replay a captured decision (capture.py) with PowerSGD's priced hook work scaled, by factor.
    python whatif.py OUT.pkl STEP"""
import pickle, sys
import autocomp.cost_model as C
captured = pickle.load(open(sys.argv[1], "rb"))
orig = C.CostModel.compress_seconds_many
for factor in (1.0, 1.1, 1.2, 1.3, 1.5, 1.7):
    def scaled(self, items, nonzero_shares=None, _f=factor):
        out = orig(self, items, nonzero_shares)
        specs = [(i[0] if isinstance(i[0], str) else i[0].spec) for i in items]
        return [v * _f if s.startswith("powersgd") else v for v, s in zip(out, specs)]
    C.CostModel.compress_seconds_many = scaled
    for blob, _, plan, step in captured:
        if step != int(sys.argv[2]):
            continue
        engine, a, k = pickle.loads(blob)
        d = engine.decide(*a, **k)
        print(f"x{factor}: step {step} {d.solver}: {sorted(set(d.plan.values()))} predicted {d.predicted_step_seconds*1e3:.1f} ms, fastest {d.fastest_step_seconds*1e3:.1f}, uncompressed {(d.uncompressed_step_seconds or 0)*1e3:.1f}")
