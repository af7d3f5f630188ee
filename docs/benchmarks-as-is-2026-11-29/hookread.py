"""The hook's own PowerSGD error reading in a real 2-rank gloo run (loopback), rank 4 pinned
everywhere in adaptive mode (so the profiler samples), gpt-deep / gpt, 131 steps, seed 0.
Writes windows via AUTOCOMP_RECORD_WINDOWS to /tmp/s30/hookread-TASK.jsonl; the
L1-weighted mean e^2 of the windows from step 40 is in hookread.txt. From the repository root:
  python docs/benchmarks-as-is-2026-11-29/hookread.py gpt-deep gpt"""
import os, sys, tempfile, datetime
import torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, task_name, store_path, out):
    sys.path.insert(0, "docs/benchmarks-heldout-gpt12-2026-11-26"); import sitecustomize  # noqa
    os.environ["AUTOCOMP_RECORD_WINDOWS"] = out if rank == 0 else ""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    import autocomp
    from autocomp_bench.tasks import build_task
    from torch.nn.parallel import DistributedDataParallel as DDP
    task = build_task(task_name)
    torch.manual_seed(0)
    model = task.build_model()
    ddp = DDP(model)
    ctl = autocomp.wrap(ddp, target_overlap=0.9, plan={"*": "powersgd:rank=4"}, window=10, warmup_steps=2)
    opt = task.make_optimizer(ddp.parameters())
    for step in range(131):
        x, y = task.batch(rank, step, 0)
        loss = task.loss(ddp(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    ctl.close()
    dist.destroy_process_group()

if __name__ == "__main__":
    for name in sys.argv[1:]:
        d = tempfile.mkdtemp()
        out = f"/tmp/s30/hookread-{name}.jsonl"
        if os.path.exists(out): os.remove(out)
        mp.spawn(worker, args=(name, os.path.join(d, "store"), out), nprocs=2)
        print(name, "windows written to", out)
