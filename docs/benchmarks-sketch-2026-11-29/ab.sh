#!/bin/bash
# Equal-time A/B of the averaged-error engine against the engine before it and PyTorch's
# PowerSGD hook at rank 4, arms interleaved per seed (the order rotates with the seed), on
# one task at one rate, 60 s each, as root from the repository root:
#   docs/benchmarks-sketch-2026-11-29/ab.sh OUT_DIR TASK RATE SEED...
# OLD is a worktree of the commit before (default /tmp/s31/old: `git worktree add
# /tmp/s31/old 075aee8`); its arm runs from there, so that `python -m` workers import its
# autocomp. Adaptive arms record their windows (AUTOCOMP_RECORD_WINDOWS) beside the JSON.
out=$1; task=$2; rate=$3; shift 3
old=${OLD:-/tmp/s31/old}
here=$(pwd)
arms=(powersgd new old)
mkdir -p $out
out=$(cd $out && pwd)
for seed in "$@"; do
  n=${#arms[@]}; order=()
  for ((i = 0; i < n; i++)); do order+=(${arms[$(((i + seed) % n))]}); done
  for arm in "${order[@]}"; do
    tag=$task-$rate-$arm-s$seed
    case $arm in
      powersgd) dir=$here; method=powersgd; path=$here/docs/benchmarks-heldout-gpt12-2026-11-26;;
      new) dir=$here; method=adaptive; path=$here/docs/benchmarks-heldout-gpt12-2026-11-26;;
      old) dir=$old; method=adaptive; path=$old:$old/docs/benchmarks-heldout-gpt12-2026-11-26;;
    esac
    rm -f $out/windows-$tag.jsonl
    (cd $dir && PYTHONPATH=$path AUTOCOMP_RECORD_WINDOWS=$out/windows-$tag.jsonl \
      setsid -w $here/.venv/bin/autocomp-bench tta --tasks $task --rates $rate --methods $method \
      --adaptive-kwargs '{"target_overlap": 0.9}' --seeds $seed --budget-s 60 \
      --json $out/$tag.json > $out/$tag.log 2>&1)
    grep "\.\.\." $out/$tag.log | sed "s/^/$arm s$seed /"
  done
done
