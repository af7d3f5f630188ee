#!/bin/bash
# Equal-time A/B on one tta cell, arms interleaved per seed (the order rotates with the
# seed), from the repository root as root:
#   OLD=<worktree of the code before> ARMS="new old allreduce" [FORCE_OPENING=1] ab.sh OUT TASK RATE BUDGET_S SEED...
# new: this tree's adaptive; old: the worktree's adaptive; any other arm: a tta method here.
# FORCE_OPENING=1 makes the opening decide in every run (opening_ratio 2, through
# force/sitecustomize.py, in every arm). Adaptive arms record their windows beside the JSON.
out=$1; task=$2; rate=$3; budget=$4; shift 4
here=$(pwd)
arms=(${ARMS:-new old allreduce})
force=
if [ -n "$FORCE_OPENING" ]; then force=$here/docs/benchmarks-opening-refuted-2026-11-30/force:; fi
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
    (cd $dir && PYTHONPATH=$force$dir AUTOCOMP_RECORD_WINDOWS=$out/windows-$tag.jsonl \
      setsid -w $here/.venv/bin/autocomp-bench tta --tasks $task --rates $rate --methods $method \
      --oracle-grid psgd4 --seeds $seed --budget-s $budget --json $out/$tag.json > $out/$tag.log 2>&1)
    grep "\.\.\." $out/$tag.log | sed "s/^/$arm s$seed /"
  done
done
