#!/bin/bash
# Equal-time A/B of any tta methods on one task at one rate, arms interleaved per seed (the
# order rotates with the seed), as root from the repository root:
#   ARMS="powersgd new old" docs/benchmarks-matrix-2026-11-29/ab.sh OUT TASK RATE BUDGET_S SEED...
# `new` is this tree's adaptive, `old` the adaptive of a worktree at OLD (default
# /tmp/s32/old: `git worktree add /tmp/s32/old 075aee8`), any other arm a tta method of this
# tree (`oracle` on the grid psgd4). Adaptive arms record their windows beside the JSON.
# Summaries: summarize_ab.py OUT REFERENCE_ARM.
out=$1; task=$2; rate=$3; budget=$4; shift 4
old=${OLD:-/tmp/s32/old}
here=$(pwd)
arms=(${ARMS:-allreduce new old})
mkdir -p $out; out=$(cd $out && pwd)
for seed in "$@"; do
  n=${#arms[@]}; order=()
  for ((i = 0; i < n; i++)); do order+=(${arms[$(((i + seed) % n))]}); done
  for arm in "${order[@]}"; do
    tag=$task-$rate-$arm-s$seed
    case $arm in
      new) dir=$here; method=adaptive; path=$here/docs/benchmarks-heldout-gpt12-2026-11-26;;
      old) dir=$old; method=adaptive; path=$old:$old/docs/benchmarks-heldout-gpt12-2026-11-26;;
      *) dir=$here; method=$arm; path=$here/docs/benchmarks-heldout-gpt12-2026-11-26;;
    esac
    rm -f $out/windows-$tag.jsonl
    (cd $dir && PYTHONPATH=$path AUTOCOMP_RECORD_WINDOWS=$out/windows-$tag.jsonl \
      setsid -w $here/.venv/bin/autocomp-bench tta --tasks $task --rates $rate --methods $method \
      --oracle-grid psgd4 --adaptive-kwargs '{"target_overlap": 0.9}' --seeds $seed --budget-s $budget \
      --json $out/$tag.json > $out/$tag.log 2>&1)
    grep "\.\.\." $out/$tag.log | sed "s/^/$arm s$seed /"
  done
done
