#!/bin/bash
# Interleaved A/B at 10 Mbit/s and unshaped: new (main) vs old (6a5d081) adaptive.
for cell in mlp-lm:10mbit gpt:10mbit cnn:10mbit mlp-lm:unshaped gpt:unshaped cnn:unshaped; do
  task=${cell%%:*}; rate=${cell##*:}
  for seed in 0 1; do
    if [ $seed -eq 0 ]; then order="new old"; else order="old new"; fi
    for who in $order; do
      case $who in
        new) dir=/work/main;;
        old) dir=/tmp/wt_old;;
      esac
      cd $dir && PYTHONPATH=$dir /work/main/.venv/bin/python -m autocomp_bench.cli tta --tasks $task --rates $rate --methods adaptive --budget-s 30 --seeds $seed --json /tmp/tta4/$task-$rate-$who-s$seed.json > /tmp/tta4/$task-$rate-$who-s$seed.log 2>&1
      echo "$(date +%T) $task $rate $who s$seed done"
    done
  done
done
