#!/bin/bash
# Interleaved A/B of the contention probe: 3 pairs (wt-old, 356be0a) against 7 (wt-new, 356be0a
# with CONTENTION_PAIRS = 7),
# recording each run's windows. Args: TASK RATE SEEDS...
set -u
PTH=/work/main/.venv/lib/python3.11/site-packages/__editable__.autocomp-0.1.0.pth
PY=/work/main/.venv/bin/python
task=$1; rate=$2; shift 2
mv "$PTH" /tmp/s22/pth.aside
trap 'mv /tmp/s22/pth.aside "$PTH"' EXIT
for seed in "$@"; do
  for code in old new; do
    echo "== $task $rate $code seed $seed $(date +%T)"
    (cd /tmp && AUTOCOMP_RECORD_WINDOWS=/tmp/s22/pairs-$task-$rate-$code-s$seed.jsonl PYTHONPATH=/tmp/s22/wt-$code $PY -c "import sys; from autocomp_bench.cli import main; sys.argv=['autocomp-bench','tta','--tasks','$task','--rates','$rate','--methods','adaptive','--seeds','$seed','--budget-s','30','--json','/tmp/s22/pairs-$task-$rate-$code-s$seed.json']; main()") 2>&1 | grep '\.\.\. '
  done
done
echo DONE $(date +%T)
