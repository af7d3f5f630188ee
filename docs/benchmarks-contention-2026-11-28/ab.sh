#!/bin/bash
# PyTorch's PowerSGD hook (rank 4, one bucket) and adaptive, interleaved per seed, on the
# held-out 12-layer GPT at 50 Mbit/s, 60 s (run from the repository root, as root):
#   docs/benchmarks-contention-2026-11-28/ab.sh OUT_DIR 0 1 2
out=$1; shift
source .venv/bin/activate
mkdir -p $out
export PYTHONPATH=docs/benchmarks-heldout-gpt12-2026-11-26
for seed in "$@"; do
  if [ $((seed % 2)) = 0 ]; then order="powersgd adaptive"; else order="adaptive powersgd"; fi
  for m in $order; do
    setsid -w autocomp-bench tta --tasks gpt-deep --rates 50mbit --methods $m \
      --adaptive-kwargs '{"target_overlap": 0.9}' --seeds $seed --budget-s 60 \
      --json $out/gpt-deep-50mbit-$m-s$seed.json > $out/gpt-deep-50mbit-$m-s$seed.log 2>&1
    grep "\.\.\." $out/gpt-deep-50mbit-$m-s$seed.log | sed "s/^/s$seed /"
  done
done
