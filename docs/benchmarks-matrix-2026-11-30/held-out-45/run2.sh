#!/bin/bash
B=/work/main/.venv/bin/autocomp-bench
cd "${O:-.}"
PYTHONPATH=/work/main $B tta --budget-s 30 --seeds 1,2,3 --tasks lstm-lm --rates 50mbit --methods powersgd,oracle,adaptive --oracle-grid psgd4 --json lstm50b.json --markdown lstm50b.md > lstm50b.txt 2>&1
echo done > DONE2
