#!/bin/bash
# Interleaved A/B of useless_error 0.9 (wt-old: 71427af with the default set back) and 0.95
# (wt-new: 71427af), adaptive, 30 s budget. Args: TASK RATE SEEDS...
set -u
PTH=/work/main/.venv/lib/python3.11/site-packages/__editable__.autocomp-0.1.0.pth
PY=/work/main/.venv/bin/python
task=$1; rate=$2; shift 2
mv "$PTH" /tmp/s22/pth.aside
trap 'mv /tmp/s22/pth.aside "$PTH"' EXIT
for seed in "$@"; do
  for code in old new; do
    echo "== $task $rate $code seed $seed $(date +%T)"
    (cd /tmp && PYTHONPATH=/tmp/s22/wt-$code $PY -c "import sys; from autocomp_bench.cli import main; sys.argv=['autocomp-bench','tta','--tasks','$task','--rates','$rate','--methods','adaptive','--seeds','$seed','--budget-s','30','--json','/tmp/s22/ab-$task-$rate-$code-s$seed.json']; main()") 2>&1 | grep '\.\.\. '
  done
done
echo DONE $(date +%T)
