#!/bin/bash
# Interleaved A/B of the warm-up's early end on communication only (36ca970) against d7de29f.
# Part 1: the four tasks unshaped, plain all-reduce and adaptive, seeds 0 and 1.
# Part 2: the same tasks at 500 and 200 Mbit/s, adaptive only, seed 0 (regressions on
# links where the warm-up should still end early). new = working tree, old = worktree. As root.
set -u
OUT=${OUT_DIR:-/tmp/abw}
OLD=${OLD_TREE:-/tmp/wt-old}
mkdir -p $OUT
PY=/work/main/.venv/bin/python
run() { # label dir part args...
  local label=$1 dir=$2 part=$3; shift 3
  (cd $dir && PYTHONPATH=$dir $PY -m autocomp_bench.cli tta --tasks gpt,mlp-lm,cnn,ngram \
    --budget-s 30 "$@" --json $OUT/$label-$part.json > $OUT/$label-$part.log 2>&1)
  echo "$label $part rc=$? $(date +%T)"
}
U="--rates unshaped --methods allreduce,adaptive --seeds 0,1"
S="--rates 500mbit,200mbit --methods adaptive --seeds 0"
run new /work/main unshaped $U; run old $OLD unshaped $U
run old $OLD shaped $S; run new /work/main shaped $S
