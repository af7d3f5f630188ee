import glob, math, pickle, sys
from collections import Counter
for path in sorted(glob.glob(f"{sys.argv[1]}/decide-*.pkl")):
    c = pickle.load(open(path, "rb"))
    engine, args, kwargs = c["engine"], c["args"], dict(c["kwargs"])
    layers, timing, step, world = args[:4]
    if step < 16: continue
    kwargs.pop("locked", None); kwargs.pop("current", None)
    own = engine.decide(layers, timing, step, world, **kwargs)
    mats = [d.name for d in own.layers if d.rule not in ("1d", "too_small")]
    pin = lambda s: engine.decide(layers, timing, step, world, **{**kwargs, "pins": [(n, s) for n in mats]})
    print(f"step {step} meas {timing.step_seconds:.4f} bwd {timing.backward_seconds:.4f} hide {timing.hideable_seconds:.4f} compute {timing.compute_seconds} sync {timing.sync_seconds:.4f} contention {engine._contention() if hasattr(engine,'_contention') else '?'}")
    for name, d in (("engine", own), ("none", pin("none")), ("fp16", pin("fp16:ef=false"))):
        print(f"   {name:6s} T {d.predicted_step_seconds:.4f} C {d.predicted_comm_seconds:.4f} E {d.predicted_exposed_seconds:.4f} comp {d.compute_seconds:.4f} bytes {d.predicted_wire_bytes/1e6:.2f}MB lat {d.latency_seconds:.4f} T* {d.fastest_step_seconds}")
