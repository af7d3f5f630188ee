#!/bin/bash
# old (worktree at OLD) against new (/work/main) adaptive, one run at a time, arms alternating per seed.
set -u
B=/work/main/.venv/bin/autocomp-bench
O=${O:-/tmp/s44/ab}
OLD=${OLD:-/tmp/s44/head}
i=0
for seed in $SEEDS; do
  if [ $((i % 2)) = 0 ]; then arms="old new"; else arms="new old"; fi
  i=$((i + 1))
  for cell in $CELLS; do
    set -- ${cell/:/ }
    for arm in $arms; do
      tree=/work/main; [ $arm = old ] && tree=$OLD
      PYTHONPATH=$tree $B tta --budget-s 30 --evals ${EVALS:-8} --seeds $seed --tasks $1 --rates $2 --methods adaptive \
        --json $O/$1-$2-$arm-s$seed.json > $O/$1-$2-$arm-s$seed.txt 2>&1
    done
  done
done
echo done > $O/DONE
