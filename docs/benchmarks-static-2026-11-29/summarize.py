"""Summarize ab3.sh's runs (scratch tool): per arm and seed the steps, median step, final
validation loss, bytes per step, curve and final plan's compressor families; then per arm the
final loss and steps against PyTorch's hook on the same seed, and the loss at equal steps
(validation curves interpolated at the shorter run's last point). Writes the compact rows as
JSON to OUT and the comparison to stdout:

    python summarize.py OUT.json DIR [DIR ...]
"""

import collections
import json
import pathlib
import statistics
import sys

import numpy as np


def rows(folders: list[str]) -> list[dict]:
    out = []
    for folder in folders:
        for path in sorted(pathlib.Path(folder).glob("*-s*.json")):
            arm = path.stem.split("-50mbit-")[1].rsplit("-s", 1)[0]
            run = json.loads(path.read_text())["runs"][0]
            plan = run["info"].get("plan") or {}
            out.append(
                {
                    "arm": arm,
                    "seed": run["seed"],
                    "folder": pathlib.Path(folder).name,
                    "steps": run["steps"],
                    "median_step_s": run["median_step_s"],
                    "valid_loss": run["valid_loss"],
                    "bytes_per_step": run["bytes_per_step"],
                    "curve": run["curve"],
                    "plan_families": dict(
                        collections.Counter(spec.split(":")[0] for spec in plan.values())
                    ),
                    "plan_not_rank4": {
                        name: spec for name, spec in plan.items()
                        if spec.split(",")[0] not in ("powersgd:rank=4", "none")
                    },
                }
            )
    return out


def at_step(row: dict, step: float) -> float:
    curve = row["curve"]
    return float(np.interp(step, [p["step"] for p in curve], [p["valid_loss"] for p in curve]))


def compare(table: list[dict]) -> None:
    by = {(r["folder"], r["arm"], r["seed"]): r for r in table}
    for folder in sorted({r["folder"] for r in table}):
        arms = sorted({r["arm"] for r in table if r["folder"] == folder} - {"powersgd"})
        seeds = sorted({r["seed"] for r in table if r["folder"] == folder})
        print(f"== {folder}: seeds {seeds}")
        for seed in seeds:
            hook = by[(folder, "powersgd", seed)]
            cells = [f"hook {hook['valid_loss']:.4f} ({hook['steps']}, {hook['median_step_s']:.3f} s)"]
            for arm in arms:
                r = by[(folder, arm, seed)]
                cells.append(f"{arm} {r['valid_loss']:.4f} ({r['steps']}, {r['median_step_s']:.3f} s, {r['bytes_per_step'] / 1e6:.3f} MB)")
            print(f"s{seed}: " + "; ".join(cells))
        for arm in arms:
            d, ds, de = [], [], []
            for seed in seeds:
                r, h = by[(folder, arm, seed)], by[(folder, "powersgd", seed)]
                d.append(r["valid_loss"] - h["valid_loss"])
                ds.append(r["steps"] - h["steps"])
                n = min(r["curve"][-1]["step"], h["curve"][-1]["step"])
                de.append(at_step(r, n) - at_step(h, n))
            se = statistics.stdev(d) / len(d) ** 0.5
            print(
                f"  {arm} - hook: " + " / ".join(f"{x:+.3f}" for x in d)
                + f"; mean {statistics.mean(d):+.4f} (SE {se:.4f}); steps {statistics.mean(ds):+.1f};"
                f" at equal steps {statistics.mean(de):+.4f} (SE {statistics.stdev(de) / len(de) ** 0.5:.4f})"
            )


if __name__ == "__main__":
    table = rows(sys.argv[2:])
    pathlib.Path(sys.argv[1]).write_text(json.dumps(table, indent=1) + "\n")
    compare(table)
