"""Replay captured engine decisions offline (scratch tool, not in the package).

    AC_CAPTURE=/tmp/capout PYTHONPATH=<this folder>/capture autocomp-bench tta \
        --tasks gpt-deep --rates 50mbit --methods adaptive --budget-s 50
    python replay.py /tmp/capout

For each captured decision: the engine's own plan, the same engine with the near-useless
rule off (useless_error above any error), and two pinned plans (PowerSGD rank 4 on every
matrix; the same with int8 on the attention output projections), each with its predicted
step, summed error and predicted progress per second (error_cost over the matrices' weight).
"""

import copy
import dataclasses
import glob
import math
import pickle
import sys
from collections import Counter

from autocomp.policy.progress import progress_rate


def family(spec: str) -> str:
    return spec.split(",")[0]


def main(folder: str) -> None:
    for path in sorted(glob.glob(f"{folder}/decide-*.pkl")):
        with open(path, "rb") as f:
            captured = pickle.load(f)
        engine, args, kwargs = captured["engine"], captured["args"], dict(captured["kwargs"])
        # A capture from older code lacks newer config fields: their defaults stand in.
        engine.config = type(engine.config)(
            **{
                f.name: getattr(engine.config, f.name)
                for f in dataclasses.fields(engine.config)
                if hasattr(engine.config, f.name)
            }
        )
        layers, timing, step, world = args[:4]
        kwargs.pop("locked", None)
        kwargs.pop("current", None)
        own = engine.decide(layers, timing, step, world, **kwargs)
        matrices = [d.name for d in own.layers if d.rule not in ("1d", "too_small")]
        weight = math.fsum(engine._weight(layer) for layer in layers if layer.name in matrices)
        per_error = engine.rules.error_cost / weight
        loose = copy.copy(engine)
        loose.config = dataclasses.replace(engine.config, useless_error=2.0)
        plans = {
            "engine": own,
            "rule off": loose.decide(layers, timing, step, world, **kwargs),
            "rank 4": engine.decide(
                layers, timing, step, world,
                **{**kwargs, "pins": [(n, "powersgd:rank=4") for n in matrices]},
            ),
            "int8 out_proj": engine.decide(
                layers, timing, step, world,
                **{
                    **kwargs,
                    "pins": [
                        (n, "int8:chunk=256" if "out_proj" in n else "powersgd:rank=4")
                        for n in matrices
                    ],
                },
            ),
        }
        print(f"step {step}")
        for name, decision in plans.items():
            error = math.fsum(d.predicted_error for d in decision.layers if d.name in matrices)
            rate = progress_rate(decision.predicted_step_seconds, error, per_error)
            mix = Counter(family(d.spec) for d in decision.layers if d.name in matrices)
            print(
                f"  {name:<14} step {decision.predicted_step_seconds:.4f} s, "
                f"progress/s {rate:.4f}, {dict(mix)}"
            )


if __name__ == "__main__":
    main(sys.argv[1])
