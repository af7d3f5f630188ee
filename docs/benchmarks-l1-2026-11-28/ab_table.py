# Table of the error_weight A/B (ab_weight.sh outputs): per cell, each variant's mean final
# validation loss (steps per seed) and the per-seed difference grad_l1 - numel.
import json, sys, os
base = sys.argv[1] if len(sys.argv) > 1 else "."
cells = [("gpt", "50mbit"), ("gpt", "200mbit"), ("mlp-lm", "50mbit"), ("ngram", "50mbit"), ("cnn", "50mbit")]
print("| cell | numel | grad_l1 | per seed, grad_l1 - numel |")
print("|---|---:|---:|---|")
for task, rate in cells:
    vals = {}
    for v in ("numel", "l1"):
        runs = [json.load(open(os.path.join(base, f"{task}-{rate}-{v}-s{s}.json")))["runs"][0] for s in range(3)]
        vals[v] = runs
    def cell(runs):
        mean = sum(r["valid_loss"] for r in runs) / len(runs)
        return f"{mean:.4f} ({', '.join(str(r['steps']) for r in runs)})"
    diffs = [b["valid_loss"] - a["valid_loss"] for a, b in zip(vals["numel"], vals["l1"])]
    print(f"| {task} @ {rate} | {cell(vals['numel'])} | {cell(vals['l1'])} | "
          + " / ".join(f"{d:+.3f}" for d in diffs) + f" (mean {sum(diffs)/3:+.3f}) |")
