"""Per run: loss, steps, median step, and the early looks' compute reading and non-rank-4 plan."""
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    r = json.load(open(f))["runs"][0]
    out = []
    for t in r["info"]["trail"]:
        if t["step"] > 60: break
        plan = {n.split(".")[0] + "." + n.split(".")[-2] if n.count(".") > 1 else n: l[0].replace(",ef=true", "").replace("powersgd:rank=", "r").replace("fp16:ef=false", "fp16").replace("topk:ratio=0.01", "top1%").replace(":chunk=256", "") for n, l in t["layers"].items() if l[0] not in ("powersgd:rank=4,ef=true", "none")}
        locked = any("dwell" in l[2] or "kept" in l[2] for l in t["layers"].values())
        out.append(f"{t['step']}:{t['compute_step_s']:.3f}:{plan}{' D' if locked else ''}")
    print(f.split("/")[-1][:-5], round(r["valid_loss"], 4), r["steps"], round(r["median_step_s"], 4), " | ".join(out))
