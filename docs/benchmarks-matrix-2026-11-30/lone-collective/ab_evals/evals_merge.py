"""old vs new on the 20-point curves: the final point, and the mean over the last 10 points
(equal training time in both arms: points sit at fixed shares of the budget)."""
import json, math, statistics as st, sys, glob
O = sys.argv[1]
final, late, steps = [], [], []
for s in range(1, 6):
    try:
        runs = {a: json.load(open(f"{O}/mlp-lm-200mbit-{a}-s{s}.json"))["runs"][0] for a in ("old", "new")}
    except FileNotFoundError:
        continue
    c = {a: [p["valid_loss"] for p in r["curve"]] for a, r in runs.items()}
    n = min(len(c["old"]), len(c["new"]))
    d_final = runs["new"]["valid_loss"] - runs["old"]["valid_loss"]
    d_late = st.fmean(c["new"][n - 10 : n]) - st.fmean(c["old"][n - 10 : n])
    final.append(d_final); late.append(d_late)
    print(f"s{s}: final old {runs['old']['valid_loss']:.4f} new {runs['new']['valid_loss']:.4f} ({d_final:+.4f}); "
          f"last-10 mean {d_late:+.4f}; steps {runs['old']['steps']} / {runs['new']['steps']}; points {n}")
for name, v in (("final", final), ("last-10 mean", late)):
    if len(v) > 1:
        print(f"{name}: new - old {st.fmean(v):+.4f} (SE {st.stdev(v)/math.sqrt(len(v)):.4f}), n={len(v)}")
