#!/bin/bash
# Interleaved A/B of two code versions, adaptive, 30 s budget, from worktrees /tmp/s23/wt-old
# (96964b6) and /tmp/s23/wt-new (96964b6 with ascent-margin.patch applied). Args: TASK RATE
# SEEDS...; PREFIX names the JSONs (default ab), RECORD=1 records each run's windows.
#   PREFIX=margin RECORD=1 ab_code.sh gpt 50mbit 0 1 2; PREFIX=margin ab_code.sh gpt 200mbit 0 1 2
#   (then gpt 10mbit, mlp-lm 50mbit). The editable install is moved aside while it runs.
set -u
PTH=/work/main/.venv/lib/python3.11/site-packages/__editable__.autocomp-0.1.0.pth
PY=/work/main/.venv/bin/python
PREFIX=${PREFIX:-ab}
task=$1; rate=$2; shift 2
mv "$PTH" /tmp/s23/pth.aside
trap 'mv /tmp/s23/pth.aside "$PTH"' EXIT
for seed in "$@"; do
  for code in old new; do
    echo "== $task $rate $code seed $seed $(date +%T)"
    out=/tmp/s23/$PREFIX-$task-$rate-$code-s$seed
    record=""
    [ "${RECORD:-0}" = 1 ] && record=$out.jsonl
    (cd /tmp && AUTOCOMP_RECORD_WINDOWS=$record PYTHONPATH=/tmp/s23/wt-$code $PY -c "import sys; from autocomp_bench.cli import main; sys.argv=['autocomp-bench','tta','--tasks','$task','--rates','$rate','--methods','adaptive','--seeds','$seed','--budget-s','30','--json','$out.json']; main()") 2>&1 | grep '\.\.\. '
  done
done
echo DONE $(date +%T)
