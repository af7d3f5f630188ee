"""Per cell, adaptive against each other method run there, seed by seed, over several tta
JSON files (a one-seed matrix plus reruns of its cells with other seeds): the final
validation loss difference per seed, its mean and standard error, and the median-step ratio.
  python docs/benchmarks-matrix-2026-11-29/merge_seeds.py MATRIX.json RERUN.json [...]"""
import json
import statistics
import sys

runs = {}
for path in sys.argv[1:]:
    for run in json.load(open(path))["runs"]:
        runs[run["task"], run["rate"], run["method"], run["seed"]] = run
rerun_cells = set()
for path in sys.argv[2:]:
    rerun_cells |= {(r["task"], r["rate"]) for r in json.load(open(path))["runs"]}
for task, rate in sorted(rerun_cells):
    seeds = sorted({s for (t, r, m, s) in runs if (t, r, m) == (task, rate, "adaptive")})
    others = sorted({m for (t, r, m, s) in runs if (t, r) == (task, rate) and m != "adaptive"
                     and all((t, r, m, x) in runs for x in seeds)})
    print(f"== {task} @ {rate}, seeds {seeds}")
    for seed in seeds:
        cols = [f"{m} {runs[task, rate, m, seed]['valid_loss']:.4f} ({runs[task, rate, m, seed]['steps']}, "
                f"{runs[task, rate, m, seed]['median_step_s']:.4f} s)" for m in ["adaptive", *others]]
        print(f"  s{seed}: " + "; ".join(cols))
    for other in others:
        gaps = [runs[task, rate, "adaptive", s]["valid_loss"] - runs[task, rate, other, s]["valid_loss"] for s in seeds]
        ratios = [runs[task, rate, "adaptive", s]["median_step_s"] / runs[task, rate, other, s]["median_step_s"] for s in seeds]
        se = statistics.stdev(gaps) / len(gaps) ** 0.5 if len(gaps) > 1 else float("nan")
        print(f"  adaptive - {other}: mean {statistics.mean(gaps):+.4f} (SE {se:.4f}), per seed "
              + " / ".join(f"{g:+.3f}" for g in gaps)
              + f"; median step ratio {statistics.median(ratios):.3f}x")
