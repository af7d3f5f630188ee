#!/bin/bash
# Interleaved A/B, adaptive, 30 s budget, from two worktrees at $WORK/wt-old and wt-new (WORK: /tmp/s22).
# Args: TASK RATE SEEDS...; PREFIX names the JSONs (default ab), RECORD=1 records each run's
# windows (AUTOCOMP_RECORD_WINDOWS) beside them.
#  - useless_error: 0.9 (wt-old: 71427af with the default set back) against 0.95 (wt-new:
#    71427af); `ab.sh gpt 200mbit 3 4 5`, `ab.sh ngram 50mbit 0 1`, `ab.sh gpt 50mbit 0 1 2`.
#  - the contention probe: 3 pairs (wt-old: 356be0a) against 7 (wt-new: 356be0a with
#    CONTENTION_PAIRS = 7); `PREFIX=pairs RECORD=1 ab.sh gpt 50mbit 0 1 2`.
#  - twenty-third session, WORK=/tmp/s23: a margin on the progress ascent (wt-old: 96964b6,
#    wt-new: 96964b6 with docs/benchmarks-l1-2026-11-28/ascent-margin.patch);
#    `PREFIX=margin RECORD=1 ab.sh gpt 50mbit 0 1 2`, then gpt 200mbit, gpt 10mbit, mlp-lm 50mbit.
set -u
PTH=/work/main/.venv/lib/python3.11/site-packages/__editable__.autocomp-0.1.0.pth
PY=/work/main/.venv/bin/python
PREFIX=${PREFIX:-ab}
WORK=${WORK:-/tmp/s22}
task=$1; rate=$2; shift 2
mv "$PTH" $WORK/pth.aside
trap 'mv $WORK/pth.aside "$PTH"' EXIT
for seed in "$@"; do
  for code in old new; do
    echo "== $task $rate $code seed $seed $(date +%T)"
    out=$WORK/$PREFIX-$task-$rate-$code-s$seed
    record=""
    [ "${RECORD:-0}" = 1 ] && record=$out.jsonl
    (cd /tmp && AUTOCOMP_RECORD_WINDOWS=$record PYTHONPATH=$WORK/wt-$code $PY -c "import sys; from autocomp_bench.cli import main; sys.argv=['autocomp-bench','tta','--tasks','$task','--rates','$rate','--methods','adaptive','--seeds','$seed','--budget-s','30','--json','$out.json']; main()") 2>&1 | grep '\.\.\. '
  done
done
echo DONE $(date +%T)
