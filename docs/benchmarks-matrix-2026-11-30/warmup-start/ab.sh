#!/bin/bash
# Old (6b86701) against new (7aa61da) adaptive, interleaved per seed and cell, one run at a time.
set -u
B=/work/main/.venv/bin/autocomp-bench
O=/tmp/s40/ab
mkdir -p $O
for seed in 0 1 2; do
  for cell in "mlp-lm 200mbit" "mlp-lm 50mbit" "gpt 50mbit" "gpt 10mbit"; do
    set -- $cell
    for arm in old new; do
      tree=/work/main; [ $arm = old ] && tree=/tmp/s40/old
      PYTHONPATH=$tree $B tta --budget-s 30 --seeds $seed --tasks $1 --rates $2 --methods adaptive \
        --json $O/$1-$2-$arm-s$seed.json > $O/$1-$2-$arm-s$seed.txt 2>&1
    done
  done
done
echo done > $O/DONE
