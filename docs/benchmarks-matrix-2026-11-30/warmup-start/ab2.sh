#!/bin/bash
# More seeds of the one cell where the start is taken and matters: mlp-lm at 200 Mbit/s.
set -u
while [ ! -f /tmp/s40/ab/DONE ]; do sleep 5; done
B=/work/main/.venv/bin/autocomp-bench
O=/tmp/s40/ab
for seed in 3 4; do
  for arm in old new; do
    tree=/work/main; [ $arm = old ] && tree=/tmp/s40/old
    PYTHONPATH=$tree $B tta --budget-s 30 --seeds $seed --tasks mlp-lm --rates 200mbit --methods adaptive \
      --json $O/mlp-lm-200mbit-$arm-s$seed.json > $O/mlp-lm-200mbit-$arm-s$seed.txt 2>&1
  done
done
echo done > $O/DONE2
