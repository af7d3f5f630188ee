"""Merge the unshaped reruns (seeds 1-2) with seed 0 of the 4643fc1 matrix: DDP, fp16 hook,
adaptive per task, with adaptive's differences and step ratio."""
import json, statistics, sys
matrix, folder = sys.argv[1], sys.argv[2]
rows = {}
for r in json.load(open(matrix))["runs"]:
    if r["rate"] == "unshaped" and r["method"] in ("allreduce", "fp16", "adaptive") and r["task"] != "gpt":
        rows.setdefault(r["task"], {}).setdefault(0, {})[r["method"]] = r
for task in ("mlp-lm", "ngram", "cnn"):
    for s in (1, 2):
        for r in json.load(open(f"{folder}/{task}-s{s}.json"))["runs"]:
            rows[task].setdefault(s, {})[r["method"]] = r
se = lambda x: statistics.stdev(x) / len(x) ** 0.5
for task, seeds in rows.items():
    print("==", task)
    d_fp, d_ar, ratio, fp_ratio = [], [], [], []
    for s, ms in sorted(seeds.items()):
        print(f"  s{s}: " + "; ".join(f"{k} {v['valid_loss']:.4f} ({v['steps']}, {v['median_step_s']:.4f} s)" for k, v in ms.items()))
        d_fp.append(ms["adaptive"]["valid_loss"] - ms["fp16"]["valid_loss"])
        d_ar.append(ms["adaptive"]["valid_loss"] - ms["allreduce"]["valid_loss"])
        ratio.append(ms["adaptive"]["median_step_s"] / ms["allreduce"]["median_step_s"])
        fp_ratio.append(ms["fp16"]["median_step_s"] / ms["allreduce"]["median_step_s"])
    print(f"  adaptive - fp16 hook: {statistics.mean(d_fp):+.4f} (SE {se(d_fp):.4f}); adaptive - DDP: "
          f"{statistics.mean(d_ar):+.4f} (SE {se(d_ar):.4f}); adaptive step / DDP's "
          f"{statistics.mean(ratio):.3f}x ({', '.join(f'{x:.3f}' for x in ratio)}); fp16 hook's "
          f"{statistics.mean(fp_ratio):.3f}x")
