#!/bin/bash
# As ab.sh, with the opening's compute estimate at 30x the first forward (it probes, never acts),
# as on the Intel machine where the first forward was slow and the glance decided.
cd /work/main
export AC_OPEN_X=30
for round in 1 2; do
  for side in old new; do
    dir=/work/main; [ $side = old ] && dir=/tmp/wt_old
    for seed in 0 1; do
    PYTHONPATH=/tmp/patch:$dir .venv/bin/python -m autocomp_bench.cli tta --tasks lstm-lm --rates 35mbit --methods adaptive --budget-s 30 --seeds $seed --json /tmp/ab35/x-$side-r$round-s$seed.json > /tmp/ab35/x-$side-r$round-s$seed.log 2>&1
    done
  done
done
