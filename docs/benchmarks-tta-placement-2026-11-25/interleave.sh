#!/bin/bash
# Interleaved A/B: new (main) vs old (6a5d081) adaptive, and PyTorch's PowerSGD hook, per cell and seed.
for cell in gpt:200mbit mlp-lm:200mbit gpt:50mbit mlp-lm:50mbit; do
  task=${cell%%:*}; rate=${cell##*:}
  for seed in 0 1 2; do
    if [ $((seed % 2)) -eq 0 ]; then order="new old psgd"; else order="old psgd new"; fi
    for who in $order; do
      case $who in
        new) dir=/work/main; methods=adaptive;;
        old) dir=/tmp/wt_old; methods=adaptive;;
        psgd) dir=/work/main; methods=powersgd;;
      esac
      cd $dir && PYTHONPATH=$dir /work/main/.venv/bin/python -m autocomp_bench.cli tta --tasks $task --rates $rate --methods $methods --budget-s 30 --seeds $seed --json /tmp/tta3/$task-$rate-$who-s$seed.json > /tmp/tta3/$task-$rate-$who-s$seed.log 2>&1
      echo "$(date +%T) $task $rate $who s$seed done"
    done
  done
done
