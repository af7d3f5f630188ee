#!/bin/sh
# Interleaved A/B of the critical-level hold (2026-11-26): new = /tmp/wt_guard (the hold, from
# `git worktree add`), old = /work/main at 2314496. cd into each tree: `python -m` puts the
# current directory first on sys.path, before PYTHONPATH.

for cell in "cnn 10mbit" "cnn 50mbit"; do
  set -- $cell
  for seed in 0 1 2; do
    if [ $((seed % 2)) -eq 0 ]; then order="new old"; else order="old new"; fi
    for code in $order; do
      if [ $code = new ]; then dir=/tmp/wt_guard; else dir=/work/main; fi
      cd $dir && PYTHONPATH=$dir /work/main/.venv/bin/python -m autocomp_bench.cli tta --tasks $1 --rates $2 \
        --methods adaptive --budget-s 30 --seeds $seed --json /tmp/ab/$1-$2-$seed-$code.json \
        > /tmp/ab/$1-$2-$seed-$code.log 2>&1
    done
  done
done
echo done > /tmp/ab/finished
