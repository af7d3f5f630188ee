"""Rank 4 everywhere's per-step gap to DDP at the last evaluation, in steps of DDP's own curve:
the step at which DDP's (interpolated, seed-mean) curve reaches rank 4's final loss, over the
steps taken: the fraction of an uncompressed step rank 4 delivers. From the repository root:
  python docs/benchmarks-as-is-2026-11-29/share.py QUALITY.json TASK [QUALITY.json TASK ...]
(the files and tasks of share.txt; the held-out GPT's is
docs/benchmarks-static-2026-11-29/quality-s4-7.json)."""
import json, sys, statistics as st
for path, task in zip(sys.argv[1::2], sys.argv[2::2]):
    d = json.load(open(path))
    curves = {}
    for r in d["results"]:
        curves.setdefault(r["method"], []).append([(p["step"], p["valid_loss"]) for p in r["curve"]])  # loss even for classifiers
    mean = {m: [(c[0][i][0], st.fmean(x[i][1] for x in c)) for i in range(len(c[0]))] for m, c in curves.items()}
    ddp = mean["ddp"]; psgd = mean["autocomp:powersgd:rank=4"]
    final = psgd[-1][1]; steps = psgd[-1][0]
    # first DDP step (linear interpolation) at which DDP reaches rank 4's final loss
    at = None
    for (s0, l0), (s1, l1) in zip(ddp, ddp[1:]):
        if l0 >= final >= l1:
            at = s0 + (l0 - final) / (l0 - l1) * (s1 - s0); break
    gap = final - ddp[-1][1]
    slope = (ddp[-2][1] - ddp[-1][1]) / (ddp[-1][0] - ddp[-2][0])
    print(f"{task}: seeds {len(curves['ddp'])}, step {steps}: ddp {ddp[-1][1]:.4f}, rank 4 {final:.4f}, gap {gap:.4f}; "
          f"ddp reaches rank 4's final loss at step {at:.1f} -> rank 4 delivers {at/steps:.2f} of a step; "
          f"last-segment slope {slope:.4f}/step -> gap = {gap/slope:.1f} steps ({1-gap/slope/steps:.2f} of a step)")
