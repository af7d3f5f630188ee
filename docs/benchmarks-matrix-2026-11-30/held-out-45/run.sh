#!/bin/bash
B=/work/main/.venv/bin/autocomp-bench
cd "${O:-.}"
PYTHONPATH=/work/main $B tta --budget-s 30 --seeds 1,2 --tasks lstm-lm --rates 50mbit --methods allreduce,fp16,powersgd,limit,adaptive --json lstm50.json --markdown lstm50.md > lstm50.txt 2>&1
PYTHONPATH=/work/main $B tta --budget-s 30 --seeds 1,2 --tasks digits-resnet --rates 10mbit --methods allreduce,fp16,powersgd,limit,adaptive --json resnet10.json --markdown resnet10.md > resnet10.txt 2>&1
echo done > DONE
