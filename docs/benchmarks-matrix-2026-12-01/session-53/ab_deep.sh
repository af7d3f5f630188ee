#!/bin/bash
# Usage: ab_deep.sh OUT TASK RATE STEPS REPS (OLD tree in $OLD, default /tmp/s53/old)
# old vs new (the working tree /work/main), seq.py free_timed, arms alternating
OUT=$1; TASK=$2; RATE=$3; STEPS=$4; REPS=$5
mkdir -p $OUT
for r in $(seq 1 $REPS); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for arm in $order; do
    if [ $arm = old ]; then tree=${OLD:-/tmp/s53/old}; else tree=/work/main; fi
    (cd $tree && BLOCK=$STEPS SKIP=20 PYTHONPATH=$tree timeout 900 /work/main/.venv/bin/python /work/main/docs/benchmarks-matrix-2026-12-01/session-53/seq.py free_timed $STEPS $TASK $RATE $OUT/${arm}_$r.json > $OUT/${arm}_$r.log 2>&1)
    echo "$arm $r $(grep -h 'TIMED\|median' $OUT/${arm}_$r.log | grep -v Warn | tr '\n' ' ' | cut -c1-400)" >> $OUT/summary.txt
  done
done
