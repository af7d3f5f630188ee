#!/bin/bash
# Interleaved A/B of useless_error 0.9 (wt-old at 327f989) and 0.95 (wt-new at 0586597): gpt
# at 200 Mbit/s, adaptive, seeds 0-2.
set -u
PTH=/work/main/.venv/lib/python3.11/site-packages/__editable__.autocomp-0.1.0.pth
PY=/work/main/.venv/bin/python
mv "$PTH" /tmp/s21/pth.aside
trap 'mv /tmp/s21/pth.aside "$PTH"' EXIT
for task in gpt; do
for seed in 0 1 2; do
  for code in old new; do
    echo "== $task $code seed $seed $(date +%T)"
    (cd /tmp && PYTHONPATH=/tmp/s21/wt-$code $PY -c "import sys; from autocomp_bench.cli import main; sys.argv=['autocomp-bench','tta','--tasks','$task','--rates','200mbit','--methods','adaptive','--seeds','$seed','--budget-s','30','--json','/tmp/s21/ab4-$task-$code-s$seed.json']; main()") 2>&1 | grep '\.\.\. '
  done
done
done
echo DONE $(date +%T)
