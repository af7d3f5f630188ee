"""Replay each recorded run's first windows through the warm-up's dominance test, with the
exposed time as measured and as capped at the link's skew-free busy time.

Record with AUTOCOMP_RECORD_WINDOWS=FILE (runs append one after the other), then:

    python glance.py FILE...
"""

import json
import statistics
import sys

from autocomp.planner import GLANCE_STEP, WindowPlanner, _compute
from autocomp.window import WindowMeasurement

config = WindowPlanner.Config()
for path in sys.argv[1:]:
    print(path)
    for line in open(path):
        record = json.loads(line)
        if "measurement" not in record:
            continue
        m = WindowMeasurement.from_dict(record["measurement"])
        if m.step > 8:
            continue
        if m.step <= GLANCE_STEP:
            print("  run:")
        t = m.timings
        compute = _compute(t)
        exposed = max(0.0, t["exposed_seconds"])
        busy = statistics.median(m.busy_min) if m.busy_min else float("nan")
        ratio = config.dominance_ratio if m.step <= GLANCE_STEP else config.slow_link_ratio
        uncapped = (compute + max(0.0, t["compress_seconds"]) + exposed) / compute
        capped = (compute + max(0.0, t["compress_seconds"]) + min(exposed, busy)) / compute
        print(
            f"  step {m.step}: measured step {t['step_seconds'] * 1e3:.1f} ms, compute "
            f"{compute * 1e3:.1f} ms, exposed {exposed * 1e3:.1f} ms, link busy (MIN over ranks) "
            f"{busy * 1e3:.1f} ms; uncompressed/compute {uncapped:.1f}x as measured, "
            f"{capped:.1f}x capped (ends the warm-up at {ratio:g}x)"
        )
