#!/bin/bash
# Interleaved A/B of the size floor: arm A the default preset, arm B floor256.toml, per seed
# and cell, A then B. Run from a commit before the floor change (arm A is the default then).
#   ab.sh "1 2 3" "gpt-small 25mbit" "cnn 10mbit"    # the first table's 10/25 Mbit/s rows
#   ab.sh "1 2" "cnn 50mbit" "cnn 200mbit"           # its 50/200 Mbit/s rows
# The policy path is absolute: the workers do not run in the repo root.
cd "$(dirname "$0")/../.."  # the repo root
D=docs/benchmarks-tta-floor-2026-11-26
seeds=$1
shift
cells=("$@")
for seed in $seeds; do
  for cell in "${cells[@]}"; do
    read -r task rate <<< "$cell"
    .venv/bin/python -m autocomp_bench.cli tta --tasks $task --rates $rate --methods adaptive,powersgd --budget-s 30 --seeds $seed --json $D/ab-A-$task-$rate-$seed.json > /tmp/ab-A-$task-$rate-$seed.log 2>&1
    .venv/bin/python -m autocomp_bench.cli tta --tasks $task --rates $rate --methods adaptive --budget-s 30 --seeds $seed --adaptive-kwargs "{\"target_overlap\": 0.9, \"policy\": \"$PWD/$D/floor256.toml\"}" --json $D/ab-B-$task-$rate-$seed.json > /tmp/ab-B-$task-$rate-$seed.log 2>&1
  done
done
