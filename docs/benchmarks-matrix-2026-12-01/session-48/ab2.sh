#!/bin/bash
# A/B of ee5e6f7 (rank power rule): old = 6d404a0 tree, new = /work/main HEAD. Adaptive only.
cd /work/main
OUT=/tmp/s48/ab2
mkdir -p $OUT
for cell in "lstm-lm 500mbit" "gpt 500mbit"; do
  set -- $cell; T=$1; R=$2
  for S in 1 2 3; do
    if [ $((S % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
    for arm in $order; do
      if [ $arm = old ]; then tree=/tmp/s48/base; else tree=/work/main; fi
      PYTHONPATH=$tree .venv/bin/python -m autocomp_bench.cli tta --budget-s 30 --seeds $S \
        --tasks $T --rates $R --methods adaptive --json $OUT/${T}_${R}_${arm}_${S}.json \
        --markdown $OUT/${T}_${R}_${arm}_${S}.md > $OUT/${T}_${R}_${arm}_${S}.log 2>&1
      echo "$(date +%T) $T $R $arm $S rc=$?" >> $OUT/progress.txt
    done
  done
done
echo done >> $OUT/progress.txt
