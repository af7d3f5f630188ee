#!/bin/bash
# Interleaved A/B: floor 256 without (B) and with (C, the default) the small-layer useless rule.
cd "$(dirname "$0")/../.."  # the repo root
D=docs/benchmarks-tta-floor-2026-11-26
for seed in 1 2 3; do
  for cell in "gpt-small 25mbit" "cnn 10mbit"; do
    read -r task rate <<< "$cell"
    .venv/bin/python -m autocomp_bench.cli tta --tasks $task --rates $rate --methods adaptive --budget-s 30 --seeds $seed --adaptive-kwargs "{\"target_overlap\": 0.9, \"policy\": \"$PWD/$D/norule.toml\"}" --json $D/rule-B-$task-$rate-$seed.json > /tmp/rule-B-$task-$rate-$seed.log 2>&1
    .venv/bin/python -m autocomp_bench.cli tta --tasks $task --rates $rate --methods adaptive --budget-s 30 --seeds $seed --json $D/rule-C-$task-$rate-$seed.json > /tmp/rule-C-$task-$rate-$seed.log 2>&1
  done
done
