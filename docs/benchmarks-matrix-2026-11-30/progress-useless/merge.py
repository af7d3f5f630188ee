"""new - old per cell and seed: final validation loss, the mean of the last 10 equal-time
points, steps, and the steps at which any layer ran top-k (from the trail)."""
import glob, json, math, re, statistics, sys
O = sys.argv[1] if len(sys.argv) > 1 else "/tmp/s44/ab"
runs = {}
for f in glob.glob(f"{O}/*.json"):
    m = re.match(r".*/(.+)-(\w+mbit|unshaped)-(old|new)-s(\d+)\.json", f)
    task, rate, arm, seed = m.groups()
    r = json.load(open(f))["runs"][0]
    curve = [c["valid_loss"] for c in r["curve"]]
    topk = sorted({t["step"] for t in r["info"]["trail"] for v in t["layers"].values() if v[0].startswith("topk")})
    tk = [n for t in r["info"]["trail"][:1] for n, v in t["layers"].items() if v[0].startswith("topk")]
    runs[(task, rate, int(seed), arm)] = (r["valid_loss"], statistics.mean(curve[-10:]), r["steps"], r["median_step_s"], topk)
cells = sorted({k[:2] for k in runs})
for cell in cells:
    d_final, d_late = [], []
    print(f"== {cell[0]} @ {cell[1]}")
    for seed in sorted({k[2] for k in runs if k[:2] == cell}):
        o, n = runs.get((*cell, seed, "old")), runs.get((*cell, seed, "new"))
        if not (o and n):
            continue
        d_final.append(n[0] - o[0]); d_late.append(n[1] - o[1])
        print(f"  s{seed}: old {o[0]:.4f} (late {o[1]:.4f}, {o[2]} steps, {o[3]*1e3:.1f} ms, top-k looks {o[4][:6]}{'...' if len(o[4])>6 else ''})")
        print(f"       new {n[0]:.4f} (late {n[1]:.4f}, {n[2]} steps, {n[3]*1e3:.1f} ms, top-k looks {n[4][:6]}{'...' if len(n[4])>6 else ''})  final {n[0]-o[0]:+.4f} late {n[1]-o[1]:+.4f}")
    se = lambda v: statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else float("nan")
    if d_final:
        print(f"  new - old: final {statistics.mean(d_final):+.4f} (SE {se(d_final):.4f}), last-10 mean {statistics.mean(d_late):+.4f} (SE {se(d_late):.4f}), n={len(d_final)}")
