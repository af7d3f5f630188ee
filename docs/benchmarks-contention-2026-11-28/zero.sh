#!/bin/bash
# Held-out 12-layer GPT, 50 Mbit/s, 60 s, seed 2, windows recorded, with the opening's
# contention reading forced to none (zero-opening/sitecustomize.py), at the current tree:
#   OUT=/tmp/zero docs/benchmarks-contention-2026-11-28/zero.sh
out=${OUT:-/tmp/zero}; mkdir -p $out
source .venv/bin/activate
AUTOCOMP_RECORD_WINDOWS=$out/zero-s2.jsonl PYTHONPATH=docs/benchmarks-contention-2026-11-28/zero-opening:$PWD \
  setsid -w autocomp-bench tta --tasks gpt-deep --rates 50mbit --methods adaptive \
  --adaptive-kwargs '{"target_overlap": 0.9}' --seeds 2 --budget-s 60 --json $out/zero-s2.json > $out/zero-s2.log 2>&1
grep "\.\.\." $out/zero-s2.log
