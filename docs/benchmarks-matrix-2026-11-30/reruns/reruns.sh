#!/bin/bash
# Seeds 1-2 of the 51b5280 matrix's misses (seed 0 is the matrix run), methods interleaved per
# seed, run from a worktree of 51b5280 (PYTHONPATH), one after the other, nothing else running.
set -u
B=/work/main/.venv/bin/autocomp-bench
O=${O:-/tmp/s39/re}
mkdir -p $O
run() { name=$1; shift; PYTHONPATH=${TREE:-/tmp/s39/head} $B tta --budget-s 30 --seeds 1,2 --oracle-grid psgd4 --json $O/$name.json "$@" > $O/$name.txt 2>&1; }
run mlp200 --tasks mlp-lm --rates 200mbit --methods powersgd,adaptive,oracle
run un-ngram --tasks ngram --rates unshaped --methods allreduce,fp16,adaptive
run gpt50 --tasks gpt --rates 50mbit --methods powersgd,adaptive,oracle
run un-gpt --tasks gpt --rates unshaped --methods allreduce,adaptive
echo done > $O/DONE
