#!/bin/bash
# Interleaved A/B of the warm-up-ending decision without hysteresis: new (working tree)
# against mid (a worktree at a8338bb: the warm-up's options, the two fixes, hysteresis kept).
# gpt at 500 Mbit/s and unshaped (tta, 30 s), and hsdp-adaptive (hier, 40 s). As root.
set -u
OUT=${OUT_DIR:-/tmp/abf}
MID=${MID_TREE:-/tmp/wt-mid}
mkdir -p $OUT
PY=/work/main/.venv/bin/python
tta() { # label dir round
  (cd $2 && PYTHONPATH=$2 $PY -m autocomp_bench.cli tta --tasks gpt --rates 500mbit,unshaped \
    --methods adaptive --budget-s 30 --seeds 0 --json $OUT/tta-$1-$3.json > $OUT/tta-$1-$3.log 2>&1)
  echo "tta $1 $3 rc=$?"
}
hsdp() { # label dir round
  (cd $2 && PYTHONPATH=$2 $PY -m autocomp_bench.cli hier --budget-s 40 --methods hsdp-adaptive \
    --json $OUT/hsdp-$1-$3.json > $OUT/hsdp-$1-$3.log 2>&1)
  echo "hsdp $1 $3 rc=$?"
}
for i in 1 2 3; do
  if [ $((i % 2)) = 1 ]; then
    tta new /work/main $i; tta mid $MID $i; hsdp new /work/main $i; hsdp mid $MID $i
  else
    hsdp mid $MID $i; hsdp new /work/main $i; tta mid $MID $i; tta new /work/main $i
  fi
done
