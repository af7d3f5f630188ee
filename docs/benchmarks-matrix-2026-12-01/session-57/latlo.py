import os, sys, time, statistics, torch, torch.distributed as dist, torch.multiprocessing as mp
def w(rank):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29641", rank=rank, world_size=2)
    for nbytes in (4, 1024, 4096, 16384, 65536):
        x = torch.zeros(nbytes // 4); [dist.all_reduce(x) for _ in range(3)]
        ts = []
        for i in range(30):
            dist.barrier(); time.sleep(0.015); t = time.perf_counter(); dist.all_reduce(x); ts.append(time.perf_counter() - t)
        if rank == 0: print(nbytes, f"{statistics.median(ts)*1e3:.3f} ms")
    dist.destroy_process_group()
if __name__ == "__main__": mp.spawn(w, nprocs=2)
