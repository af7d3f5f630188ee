#!/bin/bash
# The large-embedding model on the slowest links, where the start's int8 table is dearest.
set -u
while [ ! -f /tmp/s40/ab/DONE2 ]; do sleep 5; done
B=/work/main/.venv/bin/autocomp-bench
O=/tmp/s40/ab
for seed in 0 1 2; do
  for arm in old new; do
    tree=/work/main; [ $arm = old ] && tree=/tmp/s40/old
    PYTHONPATH=$tree $B tta --budget-s 30 --seeds $seed --tasks ngram --rates 10mbit --methods adaptive \
      --json $O/ngram-10mbit-$arm-s$seed.json > $O/ngram-10mbit-$arm-s$seed.txt 2>&1
  done
done
echo done > $O/DONE3
