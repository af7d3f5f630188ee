set -x
for cell in gpt:50mbit gpt:10mbit cnn:10mbit mlp-lm:50mbit ngram:50mbit gpt:200mbit; do
  t=${cell%%:*}; r=${cell##*:}
  (cd /work/main && .venv/bin/python -m autocomp_bench.cli tta --tasks $t --rates $r --methods adaptive --budget-s 30 --json /tmp/ab4/new-$t-$r.json > /tmp/ab4/new-$t-$r.log 2>&1)
  (cd /tmp/wt_old && PYTHONPATH=/tmp/wt_old /work/main/.venv/bin/python -m autocomp_bench.cli tta --tasks $t --rates $r --methods adaptive --budget-s 30 --json /tmp/ab4/old-$t-$r.json > /tmp/ab4/old-$t-$r.log 2>&1)
done
touch /tmp/ab4/done
