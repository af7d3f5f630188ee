#!/bin/bash
# Minor faults / s and stime / s of the tta worker processes, sampled externally, per method.
B=/work/main/.venv/bin/autocomp-bench
for m in $METHODS; do
  PYTHONPATH=/work/main $B tta --budget-s 25 --evals 2 --seeds 1 --tasks mlp-lm --rates unshaped --methods $m --json ${O:-.}/f-$m.json > ${O:-.}/f-$m.txt 2>&1 &
  bp=$!
  sleep 14
  pids=$(pgrep -f "autocomp_bench.worker" | tr '\n' ' ')
  declare -A f0 s0
  for p in $pids; do f0[$p]=$(awk '{print $10}' /proc/$p/stat); s0[$p]=$(awk '{print $15}' /proc/$p/stat); done
  sleep 8
  for p in $pids; do f1=$(awk '{print $10}' /proc/$p/stat 2>/dev/null); s1=$(awk '{print $15}' /proc/$p/stat 2>/dev/null); echo "$m pid $p minflt/s $(( (f1 - ${f0[$p]}) / 8 )) stime_ticks/s $(( (s1 - ${s0[$p]}) / 8 ))"; done
  wait $bp
  python3 -c "import json; r=json.load(open('${O:-.}/f-$m.json'))['runs'][0]; print('$m', r['steps'], round(r['median_step_s']*1e3,1))"
done
