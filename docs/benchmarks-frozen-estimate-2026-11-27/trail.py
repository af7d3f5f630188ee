"""Print adaptive's decision trail (step, link estimate, compressed layers) from a tta JSON.

    python trail.py cnn-3seeds-480f647.json cnn
"""

import json
import sys

document = json.load(open(sys.argv[1]))
task = sys.argv[2]
for run in document["runs"]:
    if run["task"] != task:
        continue
    print(f"{run['method']} seed {run['seed']}: {run['steps']} steps, median step "
          f"{run['median_step_s'] * 1e3:.2f} ms, {run['bytes_per_step'] / 1e6:.3f} MB/step")
    if run["method"] != "adaptive":
        continue
    for entry in run["info"]["trail"]:
        compressed = {n: v[0] for n, v in entry["layers"].items() if v[0] != "none"}
        rate = entry["bandwidth_bytes_per_s"]
        print(f"    step {entry['step']:5d}  link {rate / 1e6 if rate else 0:7.0f} MB/s  {compressed}")
