#!/bin/bash
# Interleaved A/B of the hierarchical hook: new (working tree) vs old (worktree at HEAD), flat as reference.
set -u
mkdir -p ${OUT_DIR:-/tmp/abh}
PY=/work/main/.venv/bin/python
run() { # label dir methods
  local label=$1 dir=$2 methods=$3 i=$4
  (cd $dir && PYTHONPATH=$dir $PY -m autocomp_bench.cli hier --budget-s 40 --methods $methods --json ${OUT_DIR:-/tmp/abh}/$label-$i.json > ${OUT_DIR:-/tmp/abh}/$label-$i.log 2>&1)
  echo "$label $i rc=$?"
}
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then
    run new /work/main hier $i; run old /tmp/wt-old hier $i; run flat /work/main flat $i
  else
    run flat /work/main flat $i; run old /tmp/wt-old hier $i; run new /work/main hier $i
  fi
done
