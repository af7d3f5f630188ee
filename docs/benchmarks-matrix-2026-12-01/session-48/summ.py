import json, glob, sys, collections, statistics
d = sys.argv[1]
res = collections.defaultdict(dict)
for f in sorted(glob.glob(f"{d}/*.json")):
    j = json.load(open(f))
    name = f.split("/")[-1][:-5]
    task, rate, arm, seed = name.rsplit("_", 3)
    for r in j["rows"]:
        if r.get("method") == "adaptive":
            res[(task, rate)].setdefault(arm, {})[int(seed)] = (r.get("valid_loss"), r.get("steps"), r.get("median_step_s"))
for cell, arms in res.items():
    print(cell)
    for arm in sorted(arms):
        v = arms[arm]
        print(f"  {arm}: " + " / ".join(f"{v[s][0]:.4f} ({v[s][1]})" for s in sorted(v)), f" mean {statistics.mean(x[0] for x in v.values()):.4f}")
    if len(arms) == 2 and "new" in arms and "old" in arms:
        common = sorted(set(arms["new"]) & set(arms["old"]))
        diffs = [arms["new"][s][0] - arms["old"][s][0] for s in common]
        se = statistics.stdev(diffs) / len(diffs) ** .5 if len(diffs) > 1 else float("nan")
        print(f"  new-old: " + " / ".join(f"{x:+.4f}" for x in diffs), f" mean {statistics.mean(diffs):+.4f} SE {se:.4f}")
