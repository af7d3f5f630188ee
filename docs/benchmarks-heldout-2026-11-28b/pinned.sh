#!/bin/bash
# The adaptive controller with the whole plan pinned (pinned-grid.json: rank 4 everywhere,
# and the plans adaptive ended on in the twenty-fifth session's seeds 1 and 4), so the
# engine predicts the pinned plan's step each window and the trail keeps what each window
# measured. Held-out 12-layer GPT, 50 Mbit/s, window 15, 40 s. Run as root from the
# repository root, one at a time:
#   NAMES="psgd4 s4plan" ROUNDS="7 8" TAG=w OUT=/tmp/pinned docs/benchmarks-heldout-2026-11-28b/pinned.sh
# (2026-11-28: s1plan ran in round 4 only.)
# setsid -w: the benchmark's teardown signals its process group, which otherwise ends this
# script after the first run.
export PYTHONPATH=docs/benchmarks-heldout-gpt12-2026-11-26
out=${OUT:-/tmp/pinned}; mkdir -p $out
for round in $ROUNDS; do
for name in $NAMES; do
  plan=$(python3 -c "import json;print(json.dumps(json.load(open('docs/benchmarks-heldout-2026-11-28b/pinned-grid.json'))['$name']))")
  kw="{\"target_overlap\": 0.9, \"window\": 15, \"plan\": $plan}"
  setsid -w autocomp-bench tta --tasks gpt-deep --rates 50mbit --methods adaptive --adaptive-kwargs "$kw" \
    --seeds 0 --budget-s 40 --json $out/$name-r$round$TAG.json > $out/$name-r$round$TAG.log 2>&1
  grep "\.\.\." $out/$name-r$round$TAG.log | sed "s/^/$name r$round /"
done; done
