"""Replay a recorded run (AUTOCOMP_RECORD_WINDOWS) with
docs/benchmarks-static-2026-11-29/replay_plans.py, pinning three whole plans at every boundary:
rank 4, fp16 (ef=false) and none on every tensor. From the repository root:
  PYTHONPATH=. python docs/benchmarks-matrix-2026-12-01/session-51/vit/replay_fp16.py \
      docs/benchmarks-matrix-2026-12-01/session-51/vit/vit-rec.jsonl"""
import os
import runpy
import sys
import types

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 4))
grid = types.ModuleType("paired_steps")  # the plans replay_plans.py imports
grid.PLANS = {
    "psgd4": {"*": "powersgd:rank=4"},
    "fp16": {"*": "fp16:ef=false"},
    "none": {"*": "none"},
}
sys.modules["paired_steps"] = grid
os.environ.setdefault("PINNED", "psgd4,fp16,none")
runpy.run_path(
    os.path.join(REPO, "docs/benchmarks-static-2026-11-29/replay_plans.py"), run_name="__main__"
)
