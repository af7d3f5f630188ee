#!/bin/bash
# Held-out 12-layer GPT, 50 Mbit/s, 60 s, windows recorded (AUTOCOMP_RECORD_WINDOWS): adaptive
# seed N (adaptiveN), or the pinned plans psgd4 / s4plan of pinned-grid.json (seed 1).
#   docs/benchmarks-contention-2026-11-28/rec.sh adaptive1 psgd4 s4plan adaptive4 adaptive2 adaptive3
cd /work/main; source .venv/bin/activate
export PYTHONPATH=docs/benchmarks-heldout-gpt12-2026-11-26
out=${OUT:-/tmp/rec}; mkdir -p $out
for name in "$@"; do
  rm -f $out/$name.jsonl
  case $name in
    adaptive*) kw='{"target_overlap": 0.9}'; seed=${name#adaptive};;
    psgd4*) plan=$(python3 -c "import json;print(json.dumps(json.load(open('docs/benchmarks-heldout-2026-11-28b/pinned-grid.json'))['psgd4']))"); kw="{\"target_overlap\": 0.9, \"plan\": $plan}"; seed=1;;
    s4plan*) plan=$(python3 -c "import json;print(json.dumps(json.load(open('docs/benchmarks-heldout-2026-11-28b/pinned-grid.json'))['s4plan']))"); kw="{\"target_overlap\": 0.9, \"plan\": $plan}"; seed=1;;
  esac
  AUTOCOMP_RECORD_WINDOWS=$out/$name.jsonl setsid -w autocomp-bench tta --tasks gpt-deep --rates 50mbit --methods adaptive --adaptive-kwargs "$kw" \
    --seeds $seed --budget-s 60 --json $out/$name.json > $out/$name.log 2>&1
  grep "\.\.\." $out/$name.log | sed "s/^/$name /"
done
