import os, sys, time, statistics, torch, torch.distributed as dist
from autocomp_bench.tasks import build_task
rank = int(os.environ["RANK"]); torch.set_num_threads(1)
dist.init_process_group("gloo")
for name in ["cnn", "mlp-lm", "gpt", "ngram"]:
    m = build_task(name).build_model()
    n = sum(p.numel() for p in m.parameters())
    t = torch.zeros(n)
    for _ in range(3): dist.all_reduce(t)
    ts = []
    for _ in range(15):
        dist.barrier(); a = time.perf_counter(); dist.all_reduce(t); ts.append(time.perf_counter() - a)
    if rank == 0: print(name, n * 4 / 1e6, "MB", "allreduce med %.2f ms min %.2f" % (statistics.median(ts)*1e3, min(ts)*1e3))
dist.destroy_process_group()
