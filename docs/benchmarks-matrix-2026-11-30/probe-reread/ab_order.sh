#!/bin/bash
# Old (a worktree at OLD, default /tmp/s42/old) against new (/work/main) adaptive, one run at a time,
# per seed and cell, the arms in the order ARMS gives (default "old new"). usage:
#   ARMS="new old" SEEDS="1 2 3" CELLS="mlp-lm:10mbit cnn:10mbit" O=OUT ab_order.sh
set -u
B=/work/main/.venv/bin/autocomp-bench
O=${O:-/tmp/s42/ab}
mkdir -p $O
for seed in $SEEDS; do
  for cell in $CELLS; do
    set -- ${cell/:/ }
    for arm in ${ARMS:-old new}; do
      tree=/work/main; [ $arm = old ] && tree=${OLD:-/tmp/s42/old}
      PYTHONPATH=$tree $B tta --budget-s 30 --seeds $seed --tasks $1 --rates $2 --methods adaptive \
        --json $O/$1-$2-$arm-s$seed.json > $O/$1-$2-$arm-s$seed.txt 2>&1
    done
  done
done
echo done > $O/DONE
