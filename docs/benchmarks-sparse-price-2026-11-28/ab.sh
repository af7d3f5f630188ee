#!/bin/bash
# Side by side: 62feb2c (old) and the working tree (new), ngram adaptive, interleaved.
set -u
PTH=/work/main/.venv/lib/python3.11/site-packages/__editable__.autocomp-0.1.0.pth
PY=/work/main/.venv/bin/python
run() { # code rate seed out
  local code=$1 rate=$2 seed=$3 out=$4 root
  if [ "$code" = old ]; then root=/tmp/s20/old; else root=/tmp/s20/new; fi
  mv "$PTH" /tmp/s20/pth.aside
  (cd /tmp && PYTHONPATH=$root $PY -c "import autocomp, sys; print(autocomp.__file__, file=sys.stderr); from autocomp_bench.cli import main; sys.argv=['autocomp-bench','tta','--tasks','ngram','--rates','$rate','--methods','adaptive','--seeds','$seed','--budget-s','30','--json','$out']; main()") 2>&1 | grep -v "^$" | tail -3
  mv /tmp/s20/pth.aside "$PTH"
}
for spec in "50mbit 0" "50mbit 1" "50mbit 2" "200mbit 0" "10mbit 0"; do
  set -- $spec
  for code in old new; do
    echo "== $code $1 seed $2 $(date +%T)"
    run $code $1 $2 /tmp/s20/ab-$code-$1-s$2.json
  done
done
echo DONE $(date +%T)
