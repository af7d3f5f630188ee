#!/bin/bash
# gpt unshaped, DDP and adaptive in separate invocations, alternating, three seeds
# (2026-12-01, forty-ninth session, 07:10-07:16 UTC).
cd /work/main
for s in 1 2 3; do
  for m in adaptive allreduce; do
    nice .venv/bin/python -m autocomp_bench.cli tta --budget-s 30 --seeds $s --tasks gpt \
      --rates unshaped --methods $m --json /tmp/s49/unsh/gpt_${m}_$s.json > /tmp/s49/unsh/gpt_${m}_$s.log 2>&1
  done
done
