#!/bin/bash
# The target cell side by side at the new code: adaptive, the oracle and PyTorch's hook,
# methods interleaved within each seed by the bench itself.
set -u

O=/tmp/s40/orc; mkdir -p $O
/work/main/.venv/bin/autocomp-bench tta --budget-s 30 --seeds 0,1,2 --tasks mlp-lm --rates 200mbit \
  --methods powersgd,adaptive,oracle --oracle-grid psgd4 --json $O/mlp200.json > $O/mlp200.txt 2>&1
echo done > $O/DONE
