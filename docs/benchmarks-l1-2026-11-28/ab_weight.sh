#!/bin/bash
# A/B of the error_weight mode: adaptive with the default preset (numel) against the same
# preset with error_weight = "grad_l1", seed by seed, variants alternating.
# usage: ab_weight.sh TASK RATE SEEDS   (writes /tmp/s23/ab/TASK-RATE-{numel,l1}-sS.json)
cd /work/main
task=$1; rate=$2; seeds=$3
for s in ${seeds//,/ }; do
  for v in numel l1; do
    if [ $v = numel ]; then kw='{"target_overlap": 0.9}'; else kw='{"target_overlap": 0.9, "policy": "/tmp/s23/l1.toml"}'; fi
    .venv/bin/autocomp-bench tta --tasks $task --rates $rate --methods adaptive --seeds $s --budget-s 30 \
      --adaptive-kwargs "$kw" --json /tmp/s23/ab/$task-$rate-$v-s$s.json > /tmp/s23/ab/$task-$rate-$v-s$s.log 2>&1
    python3 -c "
import json; d=json.load(open('/tmp/s23/ab/$task-$rate-$v-s$s.json'))
r=d['runs'][0]; print('$task $rate $v s$s', r['steps'], round(r['median_step_s'],4), round(r['valid_loss'] or r.get('valid_accuracy') or 0,4), r['valid_accuracy'])"
  done
done
