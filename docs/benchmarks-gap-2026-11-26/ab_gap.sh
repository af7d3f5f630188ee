#!/bin/bash
# Interleaved A/B of the step gap (c533b0b) on the short-step autocomp-bench tta cells:
# unshaped, 500 and 200 Mbit/s. new = working tree, old = worktree at e8d24b6. As root.
set -u
OUT=${OUT_DIR:-/tmp/abg}
OLD=${OLD_TREE:-/tmp/wt-old}
mkdir -p $OUT
PY=/work/main/.venv/bin/python
TASKS=${TASKS:-gpt,mlp-lm,cnn,ngram}
RATES=${RATES:-unshaped,500mbit,200mbit}
run() { # label dir round
  local label=$1 dir=$2 i=$3
  (cd $dir && PYTHONPATH=$dir $PY -m autocomp_bench.cli tta --tasks $TASKS --rates $RATES \
    --methods adaptive --budget-s 30 --seeds 0 --json $OUT/$label-$i.json > $OUT/$label-$i.log 2>&1)
  echo "$label $i rc=$? $(date +%T)"
}
run new /work/main 1; run old $OLD 1
run old $OLD 2; run new /work/main 2
