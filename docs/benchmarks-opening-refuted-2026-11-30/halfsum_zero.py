# How often the opening's sums-of-halves probe reads fp16 as free on loopback, by rounds:
# each trial runs the contention probe and then half_sums, as the opening does.
import os, statistics, sys, time
import torch, torch.distributed as dist
import autocomp.opening as O

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
runner = O.ProbeRunner()
dev = torch.device("cpu")
payload, seconds = 32 << 20, 0.03
runner.time_all_reduce(payload, dev, None)
results = {}
for rounds in [int(x) for x in sys.argv[1].split(",")] * int(sys.argv[2]):
    O.HALF_SUM_ROUNDS = rounds
    runner.contention(payload, seconds, dev, None)
    started = time.perf_counter()
    fp16, bf16 = runner.half_sums(payload, seconds, dev, None, gradient_bytes=34 << 20)
    results.setdefault(rounds, []).append((fp16, bf16, time.perf_counter() - started))
if rank == 0:
    for rounds, values in sorted(results.items()):
        zeros = sum(v[0] == 0 for v in values)
        bzeros = sum(v[1] == 0 for v in values)
        print(
            f"rounds {rounds}: fp16 read 0 in {zeros}/{len(values)}, bf16 in {bzeros}; "
            f"fp16 median {statistics.median(v[0] for v in values):.2e} s/elem; "
            f"probe median {statistics.median(v[2] for v in values) * 1e3:.1f} ms"
        )
dist.destroy_process_group()
