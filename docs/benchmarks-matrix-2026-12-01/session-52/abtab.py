"""Pairs of abrun.sh runs (session-48/abrun.sh: adaptive only, old and new tree): per seed,
each arm's validation loss, steps, median step and a letter per decision of its trail (C a
compressed plan, n uncompressed, B a baseline window, H a payoff hold), then new - old.
  python docs/benchmarks-matrix-2026-12-01/session-52/abtab.py DIR"""

import glob
import json
import re
import statistics
import sys


def letters(run: dict) -> str:
    out = []
    for t in run["info"]["trail"]:
        reasons = " ".join(str(v[2]) for v in t["layers"].values() if len(v) > 2)
        if re.search(r"no payoff at window (\d+)", reasons):
            out.append("H")
        elif "measuring an uncompressed baseline" in reasons:
            out.append("B")
        else:
            out.append("C" if any(v[0] != "none" for v in t["layers"].values()) else "n")
    return "".join(out)


def main() -> None:
    rows: dict[tuple[str, str], dict[int, dict[str, tuple]]] = {}
    for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
        with open(path) as f:
            run = next(x for x in json.load(f)["runs"] if x["method"] == "adaptive")
        m = re.search(r"/([^/]+)_([^_]+)_(old|new)_(\d+)\.json", path)
        assert m is not None, path
        arms = rows.setdefault((m.group(1), m.group(2)), {}).setdefault(int(m.group(4)), {})
        arms[m.group(3)] = (run["valid_loss"], run["steps"], run["median_step_s"], letters(run))
    for cell, seeds in rows.items():
        print(cell)
        diffs, ratios = [], []
        for seed, arms in sorted(seeds.items()):
            old, new = arms["old"], arms["new"]
            for name, arm in (("old", old), ("new", new)):
                lead = f"  seed {seed}:" if name == "old" else "         "
                print(f"{lead} {name} {arm[0]:.4f} ({arm[1]}, {arm[2] * 1e3:.1f} ms) {arm[3]}")
            diffs.append(new[0] - old[0])
            ratios.append(new[1] / old[1])
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        each = " / ".join(f"{x:.3f}" for x in ratios)
        print(
            f"  new-old mean {statistics.mean(diffs):+.4f} (SE {se:.4f}), "
            f"steps ratio mean {statistics.mean(ratios):.3f} ({each})"
        )


if __name__ == "__main__":
    main()
