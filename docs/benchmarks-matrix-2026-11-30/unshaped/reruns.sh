#!/bin/bash
# The unshaped misses over seeds 1-2 (seed 0: the 4643fc1 matrix): DDP, PyTorch's fp16 hook and
# adaptive, per task and seed, one run at a time.
set -u
B=/work/main/.venv/bin/autocomp-bench
O=${O:-/tmp/s41/unshaped}  # then: python merge.py ../tta-4643fc1.json $O
mkdir -p $O
for seed in 1 2; do
  for task in mlp-lm ngram cnn; do
    $B tta --budget-s 30 --seeds $seed --tasks $task --rates unshaped --methods allreduce,fp16,adaptive \
      --json $O/$task-s$seed.json > $O/$task-s$seed.txt 2>&1
  done
done
echo done > $O/DONE
