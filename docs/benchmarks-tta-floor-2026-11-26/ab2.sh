#!/bin/bash
cd "$(dirname "$0")/../.."  # the repo root; arm A is the default preset, so run it at a commit before the floor change
for seed in 1 2; do
  for cell in "cnn 50mbit" "cnn 200mbit"; do
    set -- $cell
    .venv/bin/python -m autocomp_bench.cli tta --tasks $1 --rates $2 --methods adaptive,powersgd --budget-s 30 --seeds $seed --json docs/benchmarks-tta-floor-2026-11-26/ab-A-$1-$2-$seed.json > docs/benchmarks-tta-floor-2026-11-26/ab-A-$1-$2-$seed.log 2>&1
    .venv/bin/python -m autocomp_bench.cli tta --tasks $1 --rates $2 --methods adaptive --budget-s 30 --seeds $seed --adaptive-kwargs '{"target_overlap": 0.9, "policy": "docs/benchmarks-tta-floor-2026-11-26/floor256.toml"}' --json docs/benchmarks-tta-floor-2026-11-26/ab-B-$1-$2-$seed.json > docs/benchmarks-tta-floor-2026-11-26/ab-B-$1-$2-$seed.log 2>&1
  done
done

