"""Summarize an A/B folder of ab.sh: per arm and seed the final validation loss, steps and
median step; per arm its mean difference from a reference arm (seeds paired) with the
standard error; writes compact rows (no window recordings) beside the summary.
  python docs/benchmarks-matrix-2026-11-29/summarize_ab.py DIR REFERENCE_ARM [OUT_PREFIX]"""
import glob
import json
import os
import statistics
import sys

folder, reference = sys.argv[1], sys.argv[2]
prefix = sys.argv[3] if len(sys.argv) > 3 else os.path.join(folder, "summary")
rows = []
for path in sorted(glob.glob(os.path.join(folder, "*-s[0-9]*.json"))):
    arm, seed = os.path.basename(path)[:-5].rsplit("-", 2)[1:]
    run = json.load(open(path))["runs"][0]
    trail = (run.get("info") or {}).get("trail") or []
    rows.append({
        "task": run["task"], "rate": run["rate"], "arm": arm, "seed": int(seed[1:]),
        "steps": run["steps"], "median_step_s": run["median_step_s"],
        "valid_loss": run["valid_loss"], "valid_accuracy": run["valid_accuracy"],
        "mb_per_step": run["bytes_per_step"] / 1e6,
        "curve": [(p["step"], round(p["train_seconds"], 2), round(p["valid_loss"], 4)) for p in run["curve"]],
        "plans": [(t["step"], {n: v[0] for n, v in t["layers"].items()}) for t in trail],
    })
cells = sorted({(r["task"], r["rate"]) for r in rows})
if len(cells) != 1:  # rows are keyed by (arm, seed): two cells would overwrite each other
    sys.exit(f"{folder}: one task and rate per folder, found {cells}")
json.dump(rows, open(prefix + ".json", "w"), indent=0)
arms = sorted({r["arm"] for r in rows}, key=lambda a: (a != reference, a))
seeds = sorted({r["seed"] for r in rows})
by = {(r["arm"], r["seed"]): r for r in rows}
lines = [f"== {folder}: {rows[0]['task']} @ {rows[0]['rate']}, seeds {seeds}"]
for seed in seeds:
    lines.append(f"s{seed}: " + "; ".join(
        f"{a} {by[a, seed]['valid_loss']:.4f} ({by[a, seed]['steps']}, {by[a, seed]['median_step_s']:.4f} s)"
        for a in arms if (a, seed) in by))
for a in arms[1:]:
    common = [s for s in seeds if (a, s) in by and (reference, s) in by]
    d = [by[a, s]["valid_loss"] - by[reference, s]["valid_loss"] for s in common]
    r = [by[a, s]["median_step_s"] / by[reference, s]["median_step_s"] for s in common]
    se = statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan")
    lines.append(
        f"  {a} - {reference}: " + " / ".join(f"{x:+.3f}" for x in d)
        + f"; mean {statistics.mean(d):+.4f} (SE {se:.4f}); median step {statistics.mean(r):.3f}x"
        + f" ({' / '.join(f'{x:.3f}' for x in r)}); steps {statistics.mean(by[a, s]['steps'] - by[reference, s]['steps'] for s in common):+.1f}")
open(prefix + ".txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
