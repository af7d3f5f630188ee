#!/bin/bash
# Interleaved A/B: lstm-lm @ 35 Mbit/s, 30 s, adaptive at 656de0e (old) vs 3db0823 (new).
cd /work/main
for round in 1 2; do
  for side in old new; do
    dir=/work/main; [ $side = old ] && dir=/tmp/wt_old
    for seed in 0 1 2; do
    PYTHONPATH=$dir .venv/bin/python -m autocomp_bench.cli tta --tasks lstm-lm --rates 35mbit --methods adaptive --budget-s 30 --seeds $seed --json /tmp/ab35/$side-r$round-s$seed.json > /tmp/ab35/$side-r$round-s$seed.log 2>&1
    done
  done
done
