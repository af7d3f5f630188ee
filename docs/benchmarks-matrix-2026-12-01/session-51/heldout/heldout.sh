#!/bin/bash
# Held-out cells (not in the matrix), 60 s each, one seed: the peers a user could type and adaptive.
source /work/main/.venv/bin/activate
for cell in "lstm-lm 200mbit" "digits-vit 500mbit" "digits-resnet 1gbit" "mlp-lm-large 100mbit"; do
  set -- $cell
  autocomp-bench tta --budget-s 60 --seeds 1 --tasks $1 --rates $2 --methods allreduce,fp16,powersgd,adaptive --json ho-$1-$2.json > ho-$1-$2.log 2>&1
done
