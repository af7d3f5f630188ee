"""Unshaped cells with the methods' order rotated per seed: per task and seed each method's
final loss, steps and median step, with its position in that seed's order; then adaptive
minus each peer (mean and SE over seeds) and each method's mean by position."""
import glob, json, math, re, statistics, sys
from collections import defaultdict
O = sys.argv[1] if len(sys.argv) > 1 else "/tmp/s44/unshaped"
orders = [["allreduce", "fp16", "adaptive"], ["fp16", "adaptive", "allreduce"], ["adaptive", "allreduce", "fp16"]]
runs = {}
for f in glob.glob(f"{O}/*.json"):
    task, method, seed = re.match(r".*/(.+)-(allreduce|fp16|adaptive)-s(\d+)\.json", f).groups()
    r = json.load(open(f))["runs"][0]
    runs[(task, int(seed), method)] = r
seeds = sorted({k[1] for k in runs})
se = lambda v: statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else float("nan")
for task in sorted({k[0] for k in runs}):
    print(f"== {task} unshaped")
    diffs = defaultdict(list)
    ratios = defaultdict(list)
    for i, seed in enumerate(seeds):
        order = orders[i % 3]
        row = []
        for m in order:
            r = runs.get((task, seed, m))
            if r:
                row.append(f"{m} {r['valid_loss']:.4f} ({r['steps']}, {r['median_step_s']*1e3:.1f} ms)")
        print(f"  s{seed} (order {' > '.join(order)}): " + "; ".join(row))
        a = runs.get((task, seed, "adaptive"))
        for peer in ("allreduce", "fp16"):
            p = runs.get((task, seed, peer))
            if a and p:
                diffs[peer].append(a["valid_loss"] - p["valid_loss"])
                ratios[peer].append(a["median_step_s"] / p["median_step_s"])
    for peer, v in diffs.items():
        print(f"  adaptive - {peer}: {statistics.mean(v):+.4f} (SE {se(v):.4f}); per seed " + " / ".join(f"{x:+.4f}" for x in v)
              + f"; median step ratio per seed " + " / ".join(f"{x:.3f}" for x in ratios[peer]))
