#!/bin/bash
# Step time on the shaped link: PyTorch's PowerSGD hook (rank 4, one bucket), the compute-only
# limit, and two static autocomp plans (rank 4 everywhere; seed 8's adaptive plan), seed by
# seed, 30 s each, held-out 12-layer GPT at 50 Mbit/s (run from the repository root, as root):
#   docs/benchmarks-static-2026-11-29/steps.sh OUT.json SEEDS [EXTRA_GRID_JSON_ENTRIES]
out=$1; seeds=$2; extra=${3:+, $3}
source .venv/bin/activate
export PYTHONPATH=docs/benchmarks-heldout-gpt12-2026-11-26
grid='{"psgd4": {"*": "powersgd:rank=4"}, "s8plan": {"embed.weight": "int8:chunk=256,ef=true", "blocks.0.attn.out_proj.weight": "int8:chunk=256,ef=true", "position": "fp16:ef=false", "*": "powersgd:rank=4"}'"$extra"'}'
setsid -w autocomp-bench tta --tasks gpt-deep --rates 50mbit --methods powersgd,limit,oracle \
  --oracle-grid "$grid" --seeds $seeds --budget-s 30 --evals 2 --json $out
