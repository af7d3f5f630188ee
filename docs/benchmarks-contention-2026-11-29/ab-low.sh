#!/bin/bash
# Held-out 12-layer GPT, 50 Mbit/s, 60 s, the opening's contention reading forced to 7.8 ns
# a byte (low-opening/sitecustomize.py); the tree before the settled flag (OLD) and after it
# (NEW), interleaved per seed, windows recorded:
#   OLD=/path/to/old/tree NEW=/path/to/new/tree OUT=/tmp/low ab-low.sh 4 2 0
out=${OUT:-/tmp/low}; mkdir -p $out
here=$(cd "$(dirname "$0")" && pwd)
for seed in "$@"; do
  for arm in old new; do
    tree=$OLD; [ $arm = new ] && tree=$NEW
    (cd $tree && source /work/main/.venv/bin/activate && \
      AUTOCOMP_RECORD_WINDOWS=$out/$arm-s$seed.jsonl PYTHONPATH=$here/low-opening:$tree \
      setsid -w python -m autocomp_bench.cli tta --tasks gpt-deep --rates 50mbit --methods adaptive \
      --adaptive-kwargs '{"target_overlap": 0.9}' --seeds $seed --budget-s 60 \
      --json $out/$arm-s$seed.json > $out/$arm-s$seed.log 2>&1)
    echo "$arm seed $seed: $(grep '\.\.\.' $out/$arm-s$seed.log | tail -1)"
  done
done
