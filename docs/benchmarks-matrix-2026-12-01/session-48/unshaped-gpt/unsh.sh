#!/bin/bash
# gpt unshaped, DDP and adaptive in separate invocations, order rotated per seed.
cd /work/main
for pair in "1 adaptive" "1 allreduce" "2 allreduce" "2 adaptive"; do
  set -- $pair
  .venv/bin/python -m autocomp_bench.cli tta --budget-s 30 --seeds $1 --tasks gpt --rates unshaped \
    --methods $2 --json /tmp/s48/unsh/gpt_${2}_$1.json > /tmp/s48/unsh/gpt_${2}_$1.log 2>&1
  echo "$(date +%T) $pair rc=$?" >> /tmp/s48/unsh/progress.txt
done
