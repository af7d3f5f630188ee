"""Merge the old/new adaptive A/B runs: per cell and seed, steps, loss, excess time, probes."""
import glob, json, math, statistics as st, sys
from collections import defaultdict
root = sys.argv[1]
rows = defaultdict(dict)
for f in sorted(glob.glob(f"{root}/*.json")):
    d = json.load(open(f))
    r = d["runs"][0]
    arm = "old" if "-old-" in f else "new"
    rows[(r["task"], r["rate"])].setdefault(r["seed"], {})[arm] = r
for cell, seeds in sorted(rows.items()):
    print("==", *cell)
    diffs = []
    for seed, arms in sorted(seeds.items()):
        line = f"  s{seed}:"
        for arm in ("old", "new"):
            r = arms.get(arm)
            if r is None:
                line += f" {arm} -"
                continue
            sp = r["step_time_spread"]
            info = r["info"]
            slow = ",".join(f"{i}:{t:.2f}" for i, t in sp["slowest"][:5])
            line += (f" {arm} {r['valid_loss']:.4f} ({r['steps']} steps, median {r['median_step_s']*1e3:.1f} ms,"
                     f" excess {sp['excess_s']:.2f} s, boundaries {info.get('boundary_seconds', 0):.2f} s; slowest {slow});")
        print(line)
        if "old" in arms and "new" in arms:
            diffs.append(arms["new"]["valid_loss"] - arms["old"]["valid_loss"])
    if len(diffs) > 1:
        print(f"  new - old: {st.fmean(diffs):+.4f} (SE {st.stdev(diffs)/math.sqrt(len(diffs)):.4f}), per seed {' / '.join(f'{d:+.4f}' for d in diffs)}")
