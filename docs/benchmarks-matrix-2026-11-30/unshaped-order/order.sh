#!/bin/bash
# Unshaped cells, DDP / PyTorch's fp16 hook / adaptive, one run per method, the methods'
# order rotated per seed (tta runs a cell's methods in a fixed order: DDP first).
set -u
B=/work/main/.venv/bin/autocomp-bench
O=${O:-/tmp/s44/unshaped}
orders=("allreduce fp16 adaptive" "fp16 adaptive allreduce" "adaptive allreduce fp16")
i=0
for seed in $SEEDS; do
  order=${orders[$((i % 3))]}; i=$((i + 1))
  for task in $TASKS; do
    for m in $order; do
      PYTHONPATH=/work/main $B tta --budget-s 30 --evals ${EVALS:-8} --seeds $seed --tasks $task --rates unshaped \
        --methods $m --json $O/$task-$m-s$seed.json > $O/$task-$m-s$seed.txt 2>&1
    done
  done
done
echo done > $O/DONE
