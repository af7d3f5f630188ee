#!/bin/bash
# Interleaved per seed: PyTorch's PowerSGD hook, adaptive at base (a worktree of 1603be6 at
# /tmp/s26/base), adaptive at new (a5f3198 in /work/main). Each runs from its own tree's
# root: `python -m` puts the working directory first on sys.path, so from one root both
# arms import the same code (the first try did; its code digests were equal).
#   docs/benchmarks-heldout-2026-11-28b/ab.sh OUT_DIR 0 1 2
out=$1; shift
cd /work/main; source .venv/bin/activate
mkdir -p $out
held=/work/main/docs/benchmarks-heldout-gpt12-2026-11-26
TASK=${TASK:-gpt-deep}; RATE=${RATE:-50mbit}; BUDGET=${BUDGET:-60}
for seed in "$@"; do
  if [ $((seed % 2)) = 0 ]; then order="hook base new"; else order="hook new base"; fi
  for v in $order; do
    case $v in
      hook) m=powersgd; pp=$held; tree=/work/main;;
      base) m=adaptive; pp=/tmp/s26/base:$held; tree=/tmp/s26/base;;
      new) m=adaptive; pp=/work/main:$held; tree=/work/main;;
    esac
    cd $tree
    PYTHONPATH=$pp setsid -w python -m autocomp_bench.cli tta --tasks $TASK --rates $RATE --methods $m \
      --adaptive-kwargs '{"target_overlap": 0.9}' --seeds $seed --budget-s $BUDGET \
      --json $out/$TASK-$RATE-$v-s$seed.json > $out/$TASK-$RATE-$v-s$seed.log 2>&1
    grep "\.\.\." $out/$TASK-$RATE-$v-s$seed.log | sed "s/^/$TASK $RATE $v s$seed /"
  done
done
