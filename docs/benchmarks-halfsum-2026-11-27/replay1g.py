"""Replay captured gpt@1gbit decisions: the engine's plan vs pinned all-none and all-fp16
(python replay1g.py CAPTURE_DIR; capture as in costs1g.py)."""

import dataclasses, glob, math, pickle, sys
from collections import Counter


def main(folder):
    for path in sorted(glob.glob(f"{folder}/decide-*.pkl")):
        c = pickle.load(open(path, "rb"))
        engine, args, kwargs = c["engine"], c["args"], dict(c["kwargs"])
        layers, timing, step, world = args[:4]
        kwargs.pop("locked", None)
        kwargs.pop("current", None)
        own = engine.decide(layers, timing, step, world, **kwargs)
        matrices = [d.name for d in own.layers if d.rule not in ("1d", "too_small")]

        def pinned(spec):
            return engine.decide(
                layers, timing, step, world, **{**kwargs, "pins": [(n, spec) for n in matrices]}
            )

        plans = {
            "engine": own,
            "none": pinned("none"),
            "fp16": pinned("fp16:ef=false"),
            "psgd4": pinned("powersgd:rank=4"),
        }
        print(f"step {step} measured {getattr(timing, 'step_seconds', None)}")
        for name, d in plans.items():
            err = math.fsum(x.predicted_error for x in d.layers if x.name in matrices)
            mix = Counter(x.spec.split(",")[0] for x in d.layers if x.name in matrices)
            print(f"  {name:<7} step {d.predicted_step_seconds:.4f} err {err:.3f} {dict(mix)}")


main(sys.argv[1])
