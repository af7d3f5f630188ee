import os, sys, time, warnings, statistics, torch, torch.distributed as dist, torch.multiprocessing as mp
warnings.filterwarnings("ignore")
def run(rank, path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=rank, world_size=2)
    peer = 1 - rank
    for n in (250_000, 1_000_000, 6_000_000):
        x = torch.randn(n); out = torch.empty(n//2); full = torch.empty(n)
        a2a = torch.empty(n)
        def rs_a2a():
            dist.all_to_all_single(a2a, x)
            torch.sum(a2a.view(2, -1), 0, out=out)
        def rs_p2p():
            h = n//2
            mine = x[rank*h:(rank+1)*h]; theirs = x[peer*h:(peer+1)*h]
            recv = a2a[:h]
            s = dist.isend(theirs.contiguous(), peer); r = dist.irecv(recv, peer)
            s.wait(); r.wait()
            torch.add(mine, recv, out=out)
        def ag_p2p():
            h = n//2
            full[rank*h:(rank+1)*h].copy_(out)
            s = dist.isend(out, peer); r = dist.irecv(full[peer*h:(peer+1)*h], peer)
            s.wait(); r.wait()
        def ag_a2a():
            src = out.repeat(2)
            dist.all_to_all_single(full, src)
        def t(f, reps=15):
            f(); dist.barrier(); ts=[]
            for _ in range(reps):
                s = time.perf_counter(); f(); ts.append(time.perf_counter()-s)
            return statistics.median(ts)*1e3
        res = {}
        for rnd in range(2):
            for name, f in [("allreduce", lambda: dist.all_reduce(x)),
                            ("rs_tensor", lambda: dist.reduce_scatter_tensor(out, x)),
                            ("rs_a2a", rs_a2a), ("rs_p2p", rs_p2p),
                            ("allgather", lambda: dist.all_gather_into_tensor(full, out)),
                            ("ag_p2p", ag_p2p), ("ag_a2a", ag_a2a)]:
                try: res.setdefault(name, []).append(t(f))
                except Exception as e: res[name] = [str(e)[:60]]
        if rank == 0: print(n*4/1e6, "MB", {k: [round(v,2) if isinstance(v,float) else v for v in vs] for k, vs in res.items()}, flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    p = "/tmp/rs/store3"
    if os.path.exists(p): os.remove(p)
    mp.spawn(run, args=(p,), nprocs=2)
