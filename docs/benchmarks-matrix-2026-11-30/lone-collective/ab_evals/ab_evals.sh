#!/bin/bash
# old (/tmp/s43/old) vs new (/tmp/s43/new, the own-collective patch), mlp-lm 200 Mbit/s, 20 evaluations
B=/work/main/.venv/bin/autocomp-bench
O=/tmp/s43/ab_evals; mkdir -p $O
for s in "1:new old" "2:old new" "3:new old" "4:old new" "5:new old"; do
  seed=${s%%:*}
  for arm in ${s#*:}; do
    PYTHONPATH=/tmp/s43/$arm $B tta --budget-s 30 --evals 20 --seeds $seed --tasks mlp-lm --rates 200mbit --methods adaptive \
      --json $O/mlp-lm-200mbit-$arm-s$seed.json > $O/mlp-lm-200mbit-$arm-s$seed.txt 2>&1
  done
done
echo done > $O/DONE
