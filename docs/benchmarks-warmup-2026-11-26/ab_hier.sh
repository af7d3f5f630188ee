#!/bin/bash
# Interleaved A/B of the warm-up's accurate options (warmup_max_error): new (working tree)
# against old (a worktree at 09ebada, the all-uncompressed warm-up), on the two-node
# benchmark: HSDP adaptive and hierarchical DDP, plain HSDP as the reference. As root.
set -u
OUT=${OUT_DIR:-/tmp/abw}
OLD=${OLD_TREE:-/tmp/wt-old}
mkdir -p $OUT
PY=/work/main/.venv/bin/python
run() { # label dir methods round
  local label=$1 dir=$2 methods=$3 i=$4
  (cd $dir && PYTHONPATH=$dir $PY -m autocomp_bench.cli hier --budget-s 40 --methods $methods \
    --json $OUT/$label-$i.json > $OUT/$label-$i.log 2>&1)
  echo "$label $i rc=$?"
}
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then
    run new-hsdp /work/main hsdp-adaptive $i; run old-hsdp $OLD hsdp-adaptive $i
    run plain-hsdp /work/main hsdp $i
    run new-hier /work/main hier $i; run old-hier $OLD hier $i
  else
    run old-hier $OLD hier $i; run new-hier /work/main hier $i
    run plain-hsdp /work/main hsdp $i
    run old-hsdp $OLD hsdp-adaptive $i; run new-hsdp /work/main hsdp-adaptive $i
  fi
done
