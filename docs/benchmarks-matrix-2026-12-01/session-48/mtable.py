"""The matrix's summary table (as in benchmarks-history.md's matrix sections) from a tta JSON."""
import json, sys
j = json.load(open(sys.argv[1]))
rows = j["rows"]
cells = {}
for r in rows:
    cells.setdefault((r["task"], r["rate"]), {})[r["method"]] = r
names = {"allreduce": "DDP", "fp16": "fp16", "powersgd": "psgd", "limit": "limit"}
tasks = ["mlp-lm", "gpt", "cnn", "ngram"]
rates = ["10mbit", "50mbit", "200mbit", "unshaped"]
print("| task | 10 Mbit/s | 50 Mbit/s | 200 Mbit/s | unshaped |")
print("|---|---|---|---|---|")
for t in tasks:
    out = [t]
    for rate in rates:
        c = cells.get((t, rate))
        if not c:
            out.append("-"); continue
        a = c.get("adaptive"); o = c.get("oracle")
        peers = {m: c[m] for m in ("allreduce", "fp16", "powersgd") if m in c and c[m].get("valid_loss") is not None}
        best = min(peers, key=lambda m: peers[m]["valid_loss"])
        vals = {"adaptive": a["valid_loss"], best: peers[best]["valid_loss"], "oracle": o["valid_loss"]}
        win = min(vals, key=vals.get)
        f = lambda m, v: f"**{v:.4f}**" if m == win else f"{v:.4f}"
        s = f"{f('adaptive', a['valid_loss'])} ({a['steps']}) vs {names[best]} {f(best, peers[best]['valid_loss'])}, oracle {f('oracle', o['valid_loss'])}"
        if rate == "unshaped":
            s += f"; step {a['median_step_s'] / c['allreduce']['median_step_s']:.3f}x"
        out.append(s)
    print("| " + " | ".join(out) + " |")
print()
for ch in j["checks"]:
    print(ch["line"] if isinstance(ch, dict) else ch)
