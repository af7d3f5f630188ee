#!/bin/bash
# Usage: [BUDGET=s] abrun.sh OUT OLD_TREE NEW_TREE SEEDS "task rate" ...   Adaptive only, arms alternating
# per seed (old first on odd seeds). Each arm runs from its own tree (cd into it: python -m puts
# the working directory first on sys.path, ahead of PYTHONPATH).
OUT=$1; OLD=$2; NEW=$3; SEEDS=$4; shift 4
PY=/work/main/.venv/bin/python
mkdir -p $OUT
for cell in "$@"; do
  set -- $cell; T=$1; R=$2
  for S in $SEEDS; do
    if [ $((S % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
    for arm in $order; do
      if [ $arm = old ]; then tree=$OLD; else tree=$NEW; fi
      (cd $tree && PYTHONPATH=$tree $PY -m autocomp_bench.cli tta --budget-s ${BUDGET:-30} --seeds $S \
        --tasks $T --rates $R --methods adaptive --json $OUT/${T}_${R}_${arm}_${S}.json \
        --markdown $OUT/${T}_${R}_${arm}_${S}.md > $OUT/${T}_${R}_${arm}_${S}.log 2>&1)
      echo "$(date +%T) $T $R $arm $S rc=$? $(grep -o 'Code [0-9a-f]*' $OUT/${T}_${R}_${arm}_${S}.md)" >> $OUT/progress.txt
    done
  done
done
echo done >> $OUT/progress.txt
