#!/bin/bash
set -u
source <(sed -n '/^PTH=/,/^}/p' /tmp/s20/ab.sh | sed 's#else root=/tmp/s20/new; fi#elif [ "$code" = b ]; then root=/tmp/s20/b; else root=/tmp/s20/new; fi#')
for seed in 0 1 2; do
  for rate in 50mbit 1gbit; do
    echo "== b $rate seed $seed $(date +%T)"
    run b $rate $seed /tmp/s20/ab-b-$rate-s$seed.json
  done
done
echo DONE $(date +%T)
