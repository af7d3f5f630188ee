#!/bin/bash
# Count warm-up early ends and compressed plans in short cnn unshaped runs, new (36ca970, /work/main)
# vs old (d7de29f, a worktree at /tmp/wt-old), interleaved. Prints each run's early windows.
HERE=$(cd "$(dirname "$0")" && pwd)
for i in 1 2 3 4 5; do
  for arm in new:/work/main old:/tmp/wt-old; do
    label=${arm%%:*}; tree=${arm#*:}
    (cd $tree && PYTHONPATH=$tree /work/main/.venv/bin/python $HERE/early_looks.py cnn 400 2>&1 | grep -v Warn > /tmp/early-$label-$i.txt)
    echo "$label $i"; cat /tmp/early-$label-$i.txt | head -8
  done
done
