#!/bin/bash
# ab_forced.sh without the forced opening (the default opening_ratio 5); same arguments.
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
    (cd $dir && PYTHONPATH=$dir AUTOCOMP_RECORD_WINDOWS=$out/windows-$tag.jsonl \
      setsid -w $here/.venv/bin/autocomp-bench tta --tasks $task --rates $rate --methods $method \
      --oracle-grid psgd4 --seeds $seed --budget-s $budget --json $out/$tag.json > $out/$tag.log 2>&1)
    grep "\.\.\." $out/$tag.log | sed "s/^/$arm s$seed /"
  done
done
