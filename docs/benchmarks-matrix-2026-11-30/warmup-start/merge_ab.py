"""Merge the old/new A/B of ab.sh: per cell, each seed's (loss, steps, median step, step-0
bytes) for both arms, and the mean new - old loss with its standard error."""
import glob, json, re, statistics, sys
folder = sys.argv[1] if len(sys.argv) > 1 else "runs"
cells = {}
for f in sorted(glob.glob(f"{folder}/*.json")):
    m = re.match(r".*/(.+)-(\w+mbit|unshaped)-(old|new)-s(\d+)\.json", f)
    task, rate, arm, seed = m.groups()
    run = json.load(open(f))["runs"][0]
    trail = run["info"]["trail"]
    step0 = next((int(e["sent_bytes_per_step"]) for e in trail if e["step"] == 1), None)
    cells.setdefault((task, rate), {}).setdefault(int(seed), {})[arm] = (
        run["valid_loss"], run["steps"], run["median_step_s"], step0)
for (task, rate), seeds in cells.items():
    print(f"== {task} @ {rate}")
    diffs = []
    for seed, arms in sorted(seeds.items()):
        line = f"  s{seed}:"
        for arm in ("old", "new"):
            if arm in arms:
                loss, steps, med, b0 = arms[arm]
                line += f" {arm} {loss:.4f} ({steps}, {med:.4f} s, step-0 {b0 / 1e6:.2f} MB);"
        print(line)
        if "old" in arms and "new" in arms:
            diffs.append(arms["new"][0] - arms["old"][0])
    if diffs:
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        print(f"  new - old: mean {statistics.mean(diffs):+.4f} (SE {se:.4f}), per seed "
              + " / ".join(f"{d:+.3f}" for d in diffs))
