"""How often the opening's sums-of-halves probe reads gloo's cost of summing halves on
loopback: ``ProbeRunner.half_sums`` eight times on one pair of ranks, as the opening calls it
for ``mlp-lm`` (a 1 MiB opening probe in 1.2 ms, 13.7 MB of gradients).

    .venv/bin/python docs/benchmarks-idle-link-baseline-2026-11-29/half_sum_openings.py
"""

import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autocomp.opening import ProbeRunner


def main(rank: int, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, 2),
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    for trial in range(8):
        halves = ProbeRunner().half_sums(
            1 << 20, 1.2e-3, torch.device("cpu"), None, gradient_bytes=13_714_432
        )
        if rank == 0:
            print(f"opening {trial}: fp16 {halves[0] * 1e9:.2f} ns/element, bf16 {halves[1] * 1e9:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(os.path.join(tempfile.mkdtemp(), "store"),), nprocs=2)
