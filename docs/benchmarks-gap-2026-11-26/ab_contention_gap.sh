#!/bin/bash
# Interleaved A/B of counting contention against the overlap target (ef5dd41, re-applied on
# top of the step gap in the worktree /tmp/wt-cont) against the step gap alone (working
# tree), on the cells where it acted before: unshaped and 500 Mbit/s. As root.
set -u
OUT=${OUT_DIR:-/tmp/abc}
NEW=${NEW_TREE:-/tmp/wt-cont}
mkdir -p $OUT
PY=/work/main/.venv/bin/python
TASKS=${TASKS:-gpt,mlp-lm,cnn,ngram}
RATES=${RATES:-unshaped,500mbit}
run() { # label dir round
  local label=$1 dir=$2 i=$3
  (cd $dir && PYTHONPATH=$dir $PY -m autocomp_bench.cli tta --tasks $TASKS --rates $RATES \
    --methods adaptive --budget-s 30 --seeds 0 --json $OUT/$label-$i.json > $OUT/$label-$i.log 2>&1)
  echo "$label $i rc=$? $(date +%T)"
}
run contention $NEW 1; run gap /work/main 1
run gap /work/main 2; run contention $NEW 2
