#!/bin/bash
# abstep.sh OUT STEPS ROUNDS task... : old and new tree in turn, ROUNDS times per task
OUT=$1; STEPS=$2; ROUNDS=$3; shift 3
PY=/work/main/.venv/bin/python
for T in "$@"; do for r in $(seq $ROUNDS); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for arm in $order; do
    if [ $arm = old ]; then tree=${OLD:-/tmp/s56/old}; else tree=/work/main; fi
    (cd $tree && PYTHONPATH=$tree $PY $(dirname $(readlink -f $0))/abstep.py $T $STEPS $arm) >> $OUT
  done
done; done
