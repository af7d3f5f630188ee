"""Per-step share delivered: for a method's seed-mean loss at each eval step s, the step at
which DDP's seed-mean curve (interpolated) reaches that loss, over s."""
import json, sys, statistics as st
d = json.load(open(sys.argv[1]))
curves = {}
for r in d["results"]:
    curves.setdefault(r["method"], []).append([(p["step"], p["valid_loss"]) for p in r["curve"]])
mean = {m: [(c[0][i][0], st.fmean(x[i][1] for x in c)) for i in range(len(c[0]))] for m, c in curves.items()}
ddp = mean["ddp"]
def reach(loss):
    for (s0, l0), (s1, l1) in zip(ddp, ddp[1:]):
        if l0 >= loss >= l1:
            return s0 + (l0 - loss) / (l0 - l1) * (s1 - s0)
    return None
for m, c in mean.items():
    if m == "ddp": continue
    row = []
    for s, l in c:
        if s == 0: continue
        at = reach(l)
        row.append(f"{s}:{at / s:.2f}" if at else f"{s}:-")
    print(m, " ".join(row))
print("ddp", " ".join(f"{s}:{l:.3f}" for s, l in ddp))
