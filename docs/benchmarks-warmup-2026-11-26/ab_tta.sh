#!/bin/bash
# Interleaved A/B of the warm-up's accurate options on autocomp-bench tta cells where the
# warm-up is not cut short (an uncompressed step under 2x the compute): unshaped, and
# 500 Mbit/s. new = working tree, old = worktree at 09ebada. Peers run in the new tree
# (their code did not change). As root.
set -u
OUT=${OUT_DIR:-/tmp/abt}
OLD=${OLD_TREE:-/tmp/wt-old}
mkdir -p $OUT
PY=/work/main/.venv/bin/python
TASKS=${TASKS:-gpt,mlp-lm,cnn,ngram}
RATES=${RATES:-unshaped,500mbit}
run() { # label dir methods round
  local label=$1 dir=$2 methods=$3 i=$4
  (cd $dir && PYTHONPATH=$dir $PY -m autocomp_bench.cli tta --tasks $TASKS --rates $RATES \
    --methods $methods --budget-s 30 --seeds 0 --json $OUT/$label-$i.json > $OUT/$label-$i.log 2>&1)
  echo "$label $i rc=$?"
}
run new /work/main adaptive 1; run old $OLD adaptive 1; run peers /work/main allreduce,fp16 1
run old $OLD adaptive 2; run new /work/main adaptive 2
