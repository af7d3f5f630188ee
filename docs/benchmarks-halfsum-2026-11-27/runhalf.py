"""Run a 2-rank script across two network namespaces: python runhalf.py MBIT SCRIPT [ARGS]."""

import subprocess, sys
from autocomp_bench.shaped_link import ShapedLink

rate = float(sys.argv[1]) if len(sys.argv) > 1 else None
with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=rate)) as link:
    procs = [
        link.popen(
            h,
            [sys.executable, *sys.argv[2:]],
            env=link.rank_env(h, world_size=2, master_port=29611),
        )
        for h in range(2)
    ]
    for p in procs:
        p.wait(timeout=300)
