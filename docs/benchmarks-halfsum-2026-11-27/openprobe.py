"""Six openings in a row on 2 ranks; prints the probe size and the sums-of-halves readings.

python runhalf.py 1000 openprobe.py 5.0 [gradient bytes]   # 2 namespaces at 1 Gbit/s
torchrun --nproc_per_node 2 openprobe.py 5.0 [gradient bytes]   # loopback
"""

import datetime, sys, time
import torch, torch.distributed as dist

sys.path.insert(0, ".")  # run from the repository root
from autocomp.opening import ProbeRunner

torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
for trial in range(6):
    if trial % 2:
        time.sleep(0.5)  # an idle spell: tbf's bucket refills
    started = time.perf_counter()
    p = ProbeRunner().opening(
        int(sys.argv[2]) if len(sys.argv) > 2 else 5_586_000,
        0.03,
        torch.device("cpu"),
        None,
        opening_ratio=float(sys.argv[1]),
    )
    took = time.perf_counter() - started
    if dist.get_rank() == 0:
        print(
            trial,
            p.payload_bytes,
            round(p.seconds * 1e3, 2),
            "contention",
            p.contention_seconds_per_byte,
            "half ns/elem",
            [round(x * 1e9, 2) for x in p.half_sum_seconds_per_element],
            "opening ms", round(took * 1e3, 1),
            flush=True,
        )
dist.destroy_process_group()
