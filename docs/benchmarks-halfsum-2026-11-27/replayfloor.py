"""Replay captured decisions with and without counting relative errors under FLOOR as 0."""
import dataclasses, glob, math, pickle, sys
from collections import Counter
from autocomp.policy import engine as E

FLOOR = float(sys.argv[2]) if len(sys.argv) > 2 else 1e-3
orig = E.PolicyEngine._error
def floored(self, compressor, layer, rel):
    return 0.0 if rel < FLOOR else orig(self, compressor, layer, rel)

for path in sorted(glob.glob(f"{sys.argv[1]}/decide-*.pkl")):
    c = pickle.load(open(path, "rb"))
    engine, args, kwargs = c["engine"], c["args"], dict(c["kwargs"])
    layers, timing, step, world = args[:4]
    E.PolicyEngine._error = orig
    a = engine.decide(layers, timing, step, world, **kwargs)
    E.PolicyEngine._error = floored
    b = engine.decide(layers, timing, step, world, **kwargs)
    E.PolicyEngine._error = orig
    mix = lambda d: dict(Counter(x.spec.split(",")[0] for x in d.layers if x.rule not in ("1d", "too_small")))
    changed = sum(x.spec != y.spec for x, y in zip(a.layers, b.layers))
    print(f"step {step:4d} measured {timing.step_seconds:.4f} | old {a.predicted_step_seconds:.4f} {mix(a)} | floor {b.predicted_step_seconds:.4f} {mix(b)} | changed {changed}")
