# Per run: steps, median step, loss, and the n-gram table's plan at the first decisions.
import json, sys
for f in sys.argv[1:]:
    d = json.load(open(f))
    for r in d["runs"]:
        info = r["info"]
        trail = info.get("trail", [])
        tbl = [(t["step"], t["layers"].get("table.weight", ["?"])[0][:14], round(t["measured_compute_s"] or 0, 3)) for t in trail[:6]]
        print(f.split("/")[-1], r["method"], r["seed"], "steps", r["steps"], "med %.4f loss %.4f" % (r["median_step_s"], r["valid_loss"]), "first", info.get("first_decision_step"), tbl)
