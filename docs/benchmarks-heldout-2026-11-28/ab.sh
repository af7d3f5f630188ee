#!/bin/bash
# Interleaved per seed: PyTorch's PowerSGD hook (rank 4), adaptive with the default preset,
# adaptive with time_slack 0 (slack0.toml: the default preset with that one key changed).
# Held-out 12-layer GPT (registered by ../benchmarks-heldout-gpt12-2026-11-26/sitecustomize.py),
# 50 Mbit/s, 60 s each. Run as root from the repository root:
#   docs/benchmarks-heldout-2026-11-28/ab.sh OUT_DIR "hook default slack0" 3 4
set -e
out=$1; variants=$2; shift 2
here=docs/benchmarks-heldout-2026-11-28
mkdir -p "$out"
for seed in "$@"; do
  for variant in $variants; do
    case $variant in
      hook) m=powersgd; kw='{"target_overlap": 0.9}';;
      default) m=adaptive; kw='{"target_overlap": 0.9}';;
      slack0) m=adaptive; kw="{\"target_overlap\": 0.9, \"policy\": \"$PWD/$here/slack0.toml\"}";;
    esac
    PYTHONPATH=docs/benchmarks-heldout-gpt12-2026-11-26 autocomp-bench tta --tasks gpt-deep \
      --rates 50mbit --methods $m --adaptive-kwargs "$kw" --seeds "$seed" --budget-s 60 \
      --json "$out/slack-$variant-s$seed.json" > "$out/slack-$variant-s$seed.log" 2>&1
    grep "\.\.\." "$out/slack-$variant-s$seed.log" | sed "s/^/$variant s$seed /"
  done
done
