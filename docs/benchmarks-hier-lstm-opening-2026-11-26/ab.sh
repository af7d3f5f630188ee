#!/bin/bash
# Interleaved A/B of the opening's node agreement (5b43ea4) on the LSTM LM, two nodes of two
# ranks at 200 Mbit/s: hier at 5b43ea4~1 (old, a worktree at /tmp/wt-old) against hier at
# 5b43ea4 (new), flat as the reference. Rounds 1 and 3 ran old, new, flat; round 2 new, old,
# flat. As root; about 9 minutes.
set -u
PY=/work/main/.venv/bin/python
out=${OUT_DIR:-/tmp/hierx/ab}
mkdir -p "$out"
run() { # round arm
  local round=$1 arm=$2 dir=/work/main m=hier
  if [ "$arm" = old ]; then dir=/tmp/wt-old; elif [ "$arm" = flat ]; then m=flat; fi
  (cd $dir && PYTHONPATH=$dir timeout 600 $PY -m autocomp_bench.cli hier --task lstm-lm \
    --rate 200mbit --methods $m --budget-s 40 --json "$out/r$round-$arm.json" \
    > "$out/r$round-$arm.log" 2>&1)
  echo "round $round $arm rc=$? (1 = a target not evaluated: one method per call)"
}
for arm in old new flat; do run 1 $arm; done
for arm in new old flat; do run 2 $arm; done
for arm in old new flat; do run 3 $arm; done
