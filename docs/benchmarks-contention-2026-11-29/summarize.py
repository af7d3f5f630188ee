"""Summarize ab-low.sh's runs (scratch tool): per arm and seed, the run's steps, final
validation loss, bytes per step and curve, the contention readings taken again at
boundaries (the reading then in force), and the step-50 plan's compressor families with
the contention rate the engine used. Writes JSON to stdout:

    python summarize.py /tmp/low > low-summary.json
"""

import collections
import json
import pathlib
import sys


def main(folder: str) -> None:
    out = []
    for path in sorted(pathlib.Path(folder).glob("*-s*.json")):
        arm, seed = path.stem.split("-s")
        row = next(r for r in json.loads(path.read_text())["rows"] if r["method"] == "adaptive")
        lines = [json.loads(line) for line in path.with_suffix(".jsonl").open()]
        rereads = [
            x["contention_seconds_per_byte"] for x in lines if "contention_seconds_per_byte" in x
        ]
        decisions = [x["decision"] for x in lines if x.get("decision")]
        step50 = next((d for d in decisions if d["step"] >= 50), decisions[-1])
        opening = next(x["opening"] for x in lines if "opening" in x)
        out.append(
            {
                "arm": arm,
                "seed": int(seed),
                "steps": row["steps"],
                "valid_loss": row["valid_loss"],
                "bytes_per_step": row["bytes_per_step"],
                "median_step_s": row.get("median_step_s"),
                "curve": row.get("curve"),
                "opening_contention": opening["contention_seconds_per_byte"],
                "rereads_in_force": rereads,
                "plan_step": step50["step"],
                "plan_families": dict(
                    collections.Counter(layer["spec"].split(",")[0] for layer in step50["layers"])
                ),
                "contention_rate": step50["contention_rate"],
            }
        )
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
