# Per arm of an A/B folder: mean loss, steps and median step; paired loss differences.
import json, sys, glob, statistics as st, re
for d in sys.argv[1:]:
    res = {}
    for f in glob.glob(f"{d}/*.json"):
        m = re.search(r"-(new|old|allreduce)-s(\d+)\.json$", f)
        if not m: continue
        r = json.load(open(f))["runs"][0]
        res[(m[1], int(m[2]))] = (r["valid_loss"], r["steps"], r["median_step_s"])
    seeds = sorted({s for _, s in res})
    print(d, "seeds", seeds)
    for arm in ("new", "old", "allreduce"):
        xs = [res[(arm, s)] for s in seeds if (arm, s) in res]
        if not xs:
            continue
        print(f"  {arm:9s} loss {st.mean(x[0] for x in xs):.4f} steps {st.mean(x[1] for x in xs):.1f} median step {st.mean(x[2] for x in xs):.4f}")
    for a, b in (("new", "old"), ("new", "allreduce"), ("old", "allreduce")):
        diffs = [res[(a, s)][0] - res[(b, s)][0] for s in seeds if (a, s) in res and (b, s) in res]
        if not diffs:
            continue
        se = st.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        print(f"  {a}-{b}: {st.mean(diffs):+.4f} (SE {se:.4f}) per seed {[round(x,4) for x in diffs]}")
