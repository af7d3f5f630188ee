"""cProfile of autocomp's static hook (every layer none) against adaptive, stepped in turn on
2 loopback ranks, rank 0 only (scratch, session 60). From the repository root:
    PYTHONPATH=. python docs/benchmarks-matrix-2026-12-01/session-60/prof_cnn.py cnn          # free
    PYTHONPATH=. python docs/benchmarks-matrix-2026-12-01/session-60/prof_cnn.py cnn pinned   # none pinned
Free: autocomp functions by own time; pinned: by cumulative time."""
import cProfile, pstats, io, os, sys, time, datetime, tempfile
import torch, torch.distributed as dist, torch.multiprocessing as mp

def main(rank, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
    from autocomp_bench.in_turn import _attach, step_order
    from autocomp_bench.tasks import build_task
    task = build_task(sys.argv[1] if len(sys.argv) > 1 else "cnn")
    pinned = len(sys.argv) > 2 and sys.argv[2] == "pinned"
    kwargs = {"target_overlap": 0.9, **({"plan": {"*": "none"}} if pinned else {})}
    cfg = {"adaptive_kwargs": kwargs, "seed": 0}
    runs = []
    for m in ("autocomp-none", "adaptive"):
        torch.manual_seed(0); model = task.build_model()
        a = _attach(m, model, cfg); runs.append((m, a, task.make_optimizer(a.ddp.parameters())))
    profs = {m: cProfile.Profile() for m, _, _ in runs}
    tot = {m: 0.0 for m, _, _ in runs}
    for step in range(305):
        x, y = task.batch(rank, step, 0)
        for i in step_order(2, step):
            m, a, opt = runs[i]
            dist.barrier()
            p = profs[m] if (rank == 0 and step >= 5) else None
            t = time.perf_counter()
            if p: p.enable()
            loss = task.loss(a.ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); v = float(loss.item())
            if m == "adaptive": a.ctl.observe_loss(v)
            if p: p.disable()
            if step >= 5: tot[m] += time.perf_counter() - t
    if rank == 0:
        print({m: round(v / 300 * 1e3, 3) for m, v in tot.items()}, "ms/step (profiled)")
        for m, p in profs.items():
            s = io.StringIO(); st = pstats.Stats(p, stream=s); st.sort_stats("cumulative" if pinned else "tottime").print_stats("autocomp/", 25 if pinned else 30); print("=====", m); print(s.getvalue()[:6000])
    for _, a, _ in runs:
        if a.ctl is not None: a.ctl.close()
    dist.destroy_process_group()

if __name__ == "__main__":
    d = tempfile.mkdtemp()
    mp.start_processes(main, args=(os.path.join(d, "store"),), nprocs=2, start_method="spawn")
