"""Replay a recorded lstm-lm run (AUTOCOMP_RECORD_WINDOWS) with
docs/benchmarks-static-2026-11-29/replay_plans.py, pinning three whole plans at every boundary
instead of that script's two: rank 4, rank 16 and fp16 everywhere. Prints each plan's
predicted step, summed option error, the per-step progress it is priced at (1 - a E) and its
predicted progress per second relative to rank 4 everywhere. From the repository root:
  PYTHONPATH=. python docs/benchmarks-matrix-2026-12-01/session-50/replay/replay16.py \
      docs/benchmarks-matrix-2026-12-01/session-50/replay/lstm500-adaptive.jsonl"""
import os
import runpy
import sys
import types

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 4))
grid = types.ModuleType("paired_steps")  # the plans replay_plans.py imports
grid.PLANS = {
    "psgd4": {"*": "powersgd:rank=4"},
    "psgd16": {"*": "powersgd:rank=16"},
    "fp16": {"*": "fp16"},
}
sys.modules["paired_steps"] = grid
os.environ.setdefault("PINNED", "psgd4,psgd16,fp16")
runpy.run_path(
    os.path.join(REPO, "docs/benchmarks-static-2026-11-29/replay_plans.py"), run_name="__main__"
)
