#!/bin/bash
# Arms interleaved per seed (the order rotates with the seed) on the held-out 12-layer GPT at
# 50 Mbit/s, 60 s, run from the repository root, as root:
#   docs/benchmarks-static-2026-11-29/ab3.sh OUT_DIR 0 1 2
# ARMS (default "powersgd adaptive oracle") names tta methods; the oracle runs one static
# plan, GRID (default s8plan): s8plan is the plan adaptive ran on seed 8 in the twenty-eighth
# session (int8 on the tied embedding and one output projection, fp16 on the position table,
# PowerSGD rank 4 on the rest), psgd4 is rank 4 everywhere. Both start after 2 uncompressed
# steps, as PyTorch's hook does.
out=$1; shift
arms=(${ARMS:-powersgd adaptive oracle})
case ${GRID:-s8plan} in
  s8plan) grid='{"s8plan": {"embed.weight": "int8:chunk=256,ef=true", "blocks.0.attn.out_proj.weight": "int8:chunk=256,ef=true", "position": "fp16:ef=false", "*": "powersgd:rank=4"}}';;
  psgd4) grid='{"psgd4": {"*": "powersgd:rank=4"}}';;
  *) echo "unknown GRID $GRID" >&2; exit 2;;
esac
source .venv/bin/activate
mkdir -p $out
export PYTHONPATH=docs/benchmarks-heldout-gpt12-2026-11-26
for seed in "$@"; do
  n=${#arms[@]}; order=()
  for ((i = 0; i < n; i++)); do order+=(${arms[$(((i + seed) % n))]}); done
  for m in "${order[@]}"; do
    tag=$m; [ $m = oracle ] && tag=${GRID:-s8plan}
    setsid -w autocomp-bench tta --tasks gpt-deep --rates 50mbit --methods $m \
      --adaptive-kwargs '{"target_overlap": 0.9}' --oracle-grid "$grid" --seeds $seed \
      --budget-s 60 --json $out/gpt-deep-50mbit-$tag-s$seed.json > $out/gpt-deep-50mbit-$tag-s$seed.log 2>&1
    grep "\.\.\." $out/gpt-deep-50mbit-$tag-s$seed.log | sed "s/^/s$seed /"
  done
done
