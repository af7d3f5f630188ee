#!/bin/bash
# Interleaved A/B on unshaped cells: session start (2209a49) vs HEAD; 3 rounds, order flipped.
for round in 1 2 3; do
  for arm in old new; do
    [ $round = 2 ] && arm=$([ $arm = old ] && echo new || echo old)
    if [ $arm = old ]; then cd /tmp/wt_old; pp=/tmp/wt_old; else cd /work/main; pp=/work/main; fi
    PYTHONPATH=$pp /work/main/.venv/bin/python -m autocomp_bench.cli tta --tasks cnn,gpt --rates unshaped \
      --methods allreduce,adaptive --budget-s 30 --json /tmp/s13/ab_${arm}_$round.json > /tmp/s13/ab_${arm}_$round.log 2>&1
  done
done
echo done > /tmp/s13/ab.done
