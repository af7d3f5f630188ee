"""For each adaptive run of an A/B folder: the baseline hold (if any), the plan before it and
the plans after it, with each window's measured step.  python holds.py DIR"""
import glob, json, sys
short = lambda s: s.split(",")[0].replace("powersgd:rank=", "r").replace(":ef=false", "").replace("int8:chunk=256", "i8")
for f in sorted(glob.glob(f"{sys.argv[1]}/*.json")):
    for x in json.load(open(f))["runs"]:
        if x["method"] != "adaptive":
            continue
        trail = x["info"]["trail"]
        held = [i for i, t in enumerate(trail) if t["solver"] == "held"]
        print(f.split("/")[-1][:-5], "steps", x["steps"], "loss", round(x["valid_loss"], 4), "median", round(x["median_step_s"], 4))
        if not held:
            continue
        for t in trail[max(0, held[0] - 1): held[-1] + 5]:
            plan = " ".join(short(v[0]) for k, v in t["layers"].items())
            m = t["measured_step_s"]
            print(f"   {t['step']:4d} {t['solver'][:18]:18s} meas {m if m is None else round(m, 4)}  {plan}")
