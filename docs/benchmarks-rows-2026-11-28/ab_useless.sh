#!/bin/bash
# Side by side, interleaved: HEAD (old, useless_error 0.9) and the worktree with 0.95 (new),
# gpt adaptive at 50 Mbit/s, seeds 3 and 4.
set -u
PTH=/work/main/.venv/lib/python3.11/site-packages/__editable__.autocomp-0.1.0.pth
PY=/work/main/.venv/bin/python
mv "$PTH" /tmp/s21/pth.aside
trap 'mv /tmp/s21/pth.aside "$PTH"' EXIT
for seed in 3 4; do
  for code in old useless; do
    echo "== $code seed $seed $(date +%T)"
    (cd /tmp && PYTHONPATH=/tmp/s21/wt-$code $PY -c "import sys; from autocomp_bench.cli import main; sys.argv=['autocomp-bench','tta','--tasks','gpt','--rates','50mbit','--methods','adaptive','--seeds','$seed','--budget-s','30','--json','/tmp/s21/ab2-$code-s$seed.json']; main()") 2>&1 | grep '\.\.\. '
  done
done
echo DONE $(date +%T)
