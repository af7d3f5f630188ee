"""2 ranks: all-reduce ms of float32, float16 and bfloat16 at equal element counts (3 rounds of
3 passes each, a barrier before each pass). python runhalf.py 1000 halfprobe.py"""

import datetime, json, os, sys, time
import torch, torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
out = {}
for numel in (1 << 16, 1 << 18, 1 << 20):
    for rnd in range(3):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            t = torch.zeros(numel, dtype=dtype)
            dist.all_reduce(t)
            times = []
            for _ in range(3):
                dist.barrier()
                s = time.perf_counter()
                dist.all_reduce(t)
                times.append(time.perf_counter() - s)
            out.setdefault(f"{numel} {str(dtype)[6:]}", []).append(
                [round(x * 1e3, 2) for x in times]
            )
if rank == 0:
    for k, v in out.items():
        print(k, v, flush=True)
dist.destroy_process_group()
