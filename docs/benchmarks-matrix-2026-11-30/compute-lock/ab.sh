#!/bin/bash
# Old (c1684ef, a worktree at /tmp/s41/old) against new (14dd3e3, /work/main) adaptive,
# interleaved per seed and cell, one run at a time. usage:
#   SEEDS="0 1 2" CELLS="gpt:10mbit mlp-lm:200mbit gpt:50mbit" O=OUT ab.sh
#   (the evals-20 runs: the same with --evals 20 added to the tta command)
set -u
B=/work/main/.venv/bin/autocomp-bench
O=${O:-/tmp/s41/abc}
mkdir -p $O
for seed in $SEEDS; do
  for cell in $CELLS; do
    set -- ${cell/:/ }
    for arm in old new; do
      tree=/work/main; [ $arm = old ] && tree=/tmp/s41/old
      PYTHONPATH=$tree $B tta --budget-s 30 --seeds $seed --tasks $1 --rates $2 --methods adaptive \
        --json $O/$1-$2-$arm-s$seed.json > $O/$1-$2-$arm-s$seed.txt 2>&1
    done
  done
done
echo done > $O/DONE
