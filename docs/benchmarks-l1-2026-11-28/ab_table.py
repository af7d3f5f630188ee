# Table of an interleaved adaptive A/B: per cell, each variant's mean final validation loss
# (steps per seed) and the per-seed difference B - A.
#   python ab_table.py DIR                      the error_weight A/B (ab_weight.sh: numel, l1)
#   python ab_table.py DIR PREFIX A B [TITLES]  ab.sh outputs: DIR/PREFIX-TASK-RATE-{A,B}-sS.json
#     (twenty-fourth session: `ab_table.py ../benchmarks-l1measured-2026-11-28/ab l1m old new
#      "estimate (cbdb555)" "measured (931eada)"`)
import json, sys, os
base = sys.argv[1] if len(sys.argv) > 1 else "."
if len(sys.argv) > 2:
    prefix, a, b = sys.argv[2] + "-", sys.argv[3], sys.argv[4]
    titles = sys.argv[5:7] if len(sys.argv) > 6 else [a, b]
else:
    prefix, a, b, titles = "", "numel", "l1", ["numel", "grad_l1"]
cells = [("gpt", "50mbit"), ("gpt", "200mbit"), ("mlp-lm", "50mbit"), ("ngram", "50mbit"), ("cnn", "50mbit"),
         ("gpt", "10mbit"), ("gpt", "unshaped")]  # cells without JSONs are left out
print(f"| cell | {titles[0]} | {titles[1]} | per seed, {titles[1].split()[0]} - {titles[0].split()[0]} |")
print("|---|---:|---:|---|")
for task, rate in cells:
    if not os.path.exists(os.path.join(base, f"{prefix}{task}-{rate}-{a}-s0.json")):
        continue
    vals = {}
    for v in (a, b):
        runs = [json.load(open(os.path.join(base, f"{prefix}{task}-{rate}-{v}-s{s}.json")))["runs"][0] for s in range(3)]
        vals[v] = runs
    def cell(runs):
        mean = sum(r["valid_loss"] for r in runs) / len(runs)
        return f"{mean:.4f} ({', '.join(str(r['steps']) for r in runs)})"
    diffs = [y["valid_loss"] - x["valid_loss"] for x, y in zip(vals[a], vals[b])]
    print(f"| {task} @ {rate} | {cell(vals[a])} | {cell(vals[b])} | "
          + " / ".join(f"{d:+.3f}" for d in diffs) + f" (mean {sum(diffs)/3:+.3f}) |")
