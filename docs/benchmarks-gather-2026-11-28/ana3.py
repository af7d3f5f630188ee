# Per-step medians (and means) of the last bucket's timeline in timeline.py's raw JSONs, both ranks:
# enc = hook entry to the first round's launch, P = first round launch to done, P->end = from
# there to the last collective done, tail = hook entry to the last decode done (ms).
# python ana3.py defer1-rank0.json
import json, statistics as st, sys
for f in sys.argv[1:]:
  for rank in (0, 1):
    d = json.load(open(f.replace("rank0", f"rank{rank}")))
    for name, prof in sorted(d["profilers"].items()):
        steps = [s for s in prof[-70:] if len(s["coll"]) >= 3]
        P = [s["coll"][1][3] - s["coll"][1][2] for s in steps]
        after = [max(c[3] for c in s["coll"]) - s["coll"][1][3] for s in steps]
        tail = [s["finishes"][-1][1] - s["hooks"][-1][1] for s in steps]
        enc = [s["coll"][1][2] - s["hooks"][-1][1] for s in steps]
        m = lambda x: f"{st.median(x):5.1f} (mean {st.mean(x):5.1f})"
        print(f, "rank", rank, name, "n", len(steps), "enc", m(enc), "P", m(P), "P->end", m(after), "tail", m(tail))
