#!/bin/bash
# The default preset against time_slack 0 (slack0.toml), adaptive only, 30 s, per seed in
# turn, on the in-repo tasks. Run as root from the repository root:
#   docs/benchmarks-heldout-2026-11-28/in-repo-ab.sh OUT_DIR
# (2026-11-28 the gpt cells ran first, then the rest; the pair gpt 50mbit seed 1 was run
# again because a test ran beside its first default run.)
set -e
out=$1; mkdir -p "$out"
slack0="$PWD/docs/benchmarks-heldout-2026-11-28/slack0.toml"
run() { # task rate seed variant
  if [ "$4" = default ]; then kw='{"target_overlap": 0.9}'
  else kw="{\"target_overlap\": 0.9, \"policy\": \"$slack0\"}"; fi
  autocomp-bench tta --tasks "$1" --rates "$2" --methods adaptive --adaptive-kwargs "$kw" \
    --seeds "$3" --budget-s 30 --json "$out/$1-$2-$4-s$3.json" > "$out/$1-$2-$4-s$3.log" 2>&1
  grep "\.\.\." "$out/$1-$2-$4-s$3.log" | sed "s/^/$1 $2 $4 s$3 /"
}
for cell in "gpt 50mbit" "gpt 200mbit" "mlp-lm 50mbit" "ngram 50mbit" "cnn 50mbit"; do
  for seed in 0 1 2; do
    run $cell $seed default
    run $cell $seed slack0
  done
done
