#!/bin/bash
# Equal-time A/B on one tta cell, arms interleaved per seed (order rotating with the seed),
# with the opening forced to decide (opening_ratio 2: force/sitecustomize.py), from the
# repository root as root:
#   OLD=<worktree of the code before> ARMS="new old allreduce" ab_forced.sh OUT TASK RATE BUDGET_S SEED...
# new: this tree's adaptive; old: the worktree's adaptive; any other arm: a tta method here.
out=$1; task=$2; rate=$3; budget=$4; shift 4
here=$(pwd)
arms=(${ARMS:-new old allreduce})
mkdir -p $out; out=$(cd $out && pwd)
for seed in "$@"; do
  n=${#arms[@]}
  for ((i = 0; i < n; i++)); do
    arm=${arms[$(((i + seed) % n))]}
    case $arm in
      new) dir=$here; method=adaptive;;
      old) dir=${OLD:-/tmp/s38/old}; method=adaptive;;
      *) dir=$here; method=$arm;;
    esac
    tag=$task-$rate-$arm-s$seed
    (cd $dir && PYTHONPATH=${FORCE_DIR:-$here/docs/benchmarks-opening-refuted-2026-11-30/force}:$dir AUTOCOMP_RECORD_WINDOWS=$out/windows-$tag.jsonl \
      setsid -w $here/.venv/bin/autocomp-bench tta --tasks $task --rates $rate --methods $method \
      --seeds $seed --budget-s $budget --json $out/$tag.json > $out/$tag.log 2>&1)
    grep "\.\.\." $out/$tag.log | sed "s/^/$arm s$seed /"
  done
done
