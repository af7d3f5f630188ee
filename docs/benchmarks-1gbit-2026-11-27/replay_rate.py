import glob, math, pickle, sys
from collections import Counter
from autocomp.link_model import LinkEstimate
RATE = float(sys.argv[2]) if len(sys.argv) > 2 else None
for path in sorted(glob.glob(f"{sys.argv[1]}/decide-*.pkl")):
    c = pickle.load(open(path, "rb"))
    engine, args, kwargs = c["engine"], c["args"], dict(c["kwargs"])
    layers, timing, step, world = args[:4]
    if step < 16: continue
    cm = engine.cost_model
    if RATE:
        old = cm._link
        cm.update_link(LinkEstimate(latency_s=old.latency_s, bandwidth_bytes_per_s=RATE, samples=100, rel_residual=0.0))
    kwargs.pop("locked", None); kwargs.pop("current", None)
    own = engine.decide(layers, timing, step, world, **kwargs)
    mats = [d.name for d in own.layers if d.rule not in ("1d", "too_small")]
    pin = lambda s: engine.decide(layers, timing, step, world, **{**kwargs, "pins": [(n, s) for n in mats]})
    out = []
    for name, d in (("engine", own), ("none", pin("none")), ("fp16", pin("fp16:ef=false"))):
        err = math.fsum(x.predicted_error for x in d.layers if x.name in mats)
        mix = Counter(x.spec.split(",")[0] for x in d.layers if x.name in mats)
        out.append(f"{name} {d.predicted_step_seconds:.4f} e{err:.4f} {dict(mix).get('none',0)}n")
    print(f"step {step:4d} meas {timing.step_seconds:.4f} sync {timing.sync_seconds:.4f} bw {cm.bandwidth_bytes_per_s/1e6:.0f} | " + " | ".join(out))
