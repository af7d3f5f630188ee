"""Per-layer option costs (none, fp16, int8) in one captured decision, with the cost model's
half-sum figures: python costs1g.py CAPTURE_DIR INDEX. Captures: AC_CAPTURE=DIR
PYTHONPATH=$PWD/docs/benchmarks-heldout-gpt12-2026-11-26/capture autocomp-bench tta ..."""

import glob, pickle, sys, torch
from autocomp.policy.costs import LatencyCache, option_cost
from autocomp.policy.priors import built
from autocomp.compressors import Collective

for path in sorted(glob.glob(f"{sys.argv[1]}/decide-*.pkl"))[
    int(sys.argv[2]) : int(sys.argv[2]) + 1
]:
    c = pickle.load(open(path, "rb"))
    engine, args = c["engine"], c["args"]
    layers, timing, step, world = args[:4]
    cm = engine.cost_model
    lat = LatencyCache(cm, world)
    print(
        "step",
        step,
        "half_sum/elem fp16 %.3g ns" % (cm.half_sum_seconds_per_element(torch.float16) * 1e9),
        "bf16 %.3g ns" % (cm.half_sum_seconds_per_element(torch.bfloat16) * 1e9),
    )
    print(
        "allreduce 0B %.3g ms, 1MB %.3g ms"
        % (lat.comm(Collective.ALL_REDUCE, 0) * 1e3, lat.comm(Collective.ALL_REDUCE, 1 << 20) * 1e3)
    )
    tot = {}
    for layer in layers:
        if layer.shape.numel() < 50000:
            continue
        row = []
        for spec in ("none", "fp16:ef=false", "int8:chunk=256"):
            oc = option_cost(built(spec), layer, lat)
            row.append(f"{spec.split(':')[0]} comm {oc.comm * 1e3:.2f} work {oc.work * 1e3:.2f}")
            tot[spec] = tot.get(spec, 0) + oc.comm + oc.work
        print(f"{layer.name:32s} {tuple(layer.shape)}", " | ".join(row))
    print({k: round(v * 1e3, 2) for k, v in tot.items()})
    print(
        "timing:",
        {
            k: getattr(timing, k)
            for k in dir(timing)
            if not k.startswith("_") and isinstance(getattr(timing, k), (int, float))
        },
    )
