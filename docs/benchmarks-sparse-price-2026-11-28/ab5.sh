#!/bin/bash
set -u
source <(sed -n '/^PTH=/,/^}/p' /tmp/s20/ab.sh | sed "s#'ngram'#'\$TASK'#")
for TASK in cnn gpt; do
  for code in old new; do
    echo "== $code $TASK 50mbit seed 0 $(date +%T)"
    run $code 50mbit 0 /tmp/s20/ab5-$code-$TASK-50mbit-s0.json
  done
done
echo DONE $(date +%T)
