#!/bin/bash
# A/B: HEAD (/tmp/wt_old) against the working tree, interleaved, flipped order in round 2
# (old: git worktree add /tmp/wt_old 7d25ab2; steps.py is copied to /tmp/steps.py first, since
# the old tree predates it, and imports autocomp from the directory it runs in)
run() { (cd $1 && timeout 600 /work/main/.venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 /tmp/steps.py $2 allreduce,adaptive $3 1 item,observe,clock 2>&1 | grep median | sed "s#^#$4 #"); }
for round in 1 2 3; do
  if [ $round = 2 ]; then order="new old"; else order="old new"; fi
  for v in $order; do
    dir=/tmp/wt_old; [ $v = new ] && dir=/work/main
    run $dir mlp-lm 300 "r$round $v"
    run $dir cnn 1200 "r$round $v"
  done
done
