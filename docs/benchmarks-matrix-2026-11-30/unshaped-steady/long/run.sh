#!/bin/bash
# mlp-lm unshaped, 120 s budget, DDP vs adaptive, one run per method, order alternating per seed.
set -u
B=/work/main/.venv/bin/autocomp-bench
O=${O:-.}
i=0
for seed in 1 2 3; do
  if [ $((i % 2)) -eq 0 ]; then order="allreduce adaptive"; else order="adaptive allreduce"; fi; i=$((i + 1))
  for m in $order; do
    PYTHONPATH=/work/main $B tta --budget-s 120 --evals 12 --seeds $seed --tasks mlp-lm --rates unshaped \
      --methods $m --json $O/mlp-lm-$m-s$seed.json > $O/mlp-lm-$m-s$seed.txt 2>&1
  done
done
echo done > $O/DONE
