#!/bin/bash
# Interleaved A/B of contention counted against the overlap target: new (working tree) against
# prev (a worktree at 3910462). tta cells where contention is measured high: loopback
# (unshaped) and cnn at 500 Mbit/s. Two rounds, order reversed in the second. As root.
set -u
OUT=${OUT_DIR:-/tmp/abc}
PREV=${PREV_TREE:-/tmp/wt-prev}
mkdir -p $OUT
PY=/work/main/.venv/bin/python
tta() { # label dir round rates tasks
  (cd $2 && PYTHONPATH=$2 $PY -m autocomp_bench.cli tta --tasks $5 --rates $4 \
    --methods adaptive --budget-s 30 --seeds 0 --json $OUT/$1-$3-$4.json > $OUT/$1-$3-$4.log 2>&1)
  echo "$1 $3 $4 rc=$?"
}
tta new /work/main 1 unshaped gpt,mlp-lm,cnn,ngram; tta prev $PREV 1 unshaped gpt,mlp-lm,cnn,ngram
tta new /work/main 1 500mbit cnn; tta prev $PREV 1 500mbit cnn
tta prev $PREV 2 500mbit cnn; tta new /work/main 2 500mbit cnn
tta prev $PREV 2 unshaped gpt,mlp-lm,cnn,ngram; tta new /work/main 2 unshaped gpt,mlp-lm,cnn,ngram
