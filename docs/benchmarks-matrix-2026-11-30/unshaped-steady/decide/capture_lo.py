"""capture.py on loopback (2 spawned gloo ranks), with the tta loop's per-step clock all-reduce.
    python capture_lo.py TASK STEPS OUT.pkl"""
import datetime, pickle, sys, tempfile, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def worker(rank, store, task, steps, out):
    import autocomp
    import autocomp.policy.engine as E
    from autocomp_bench.tasks import build_task
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
    captured = []
    orig = E.PolicyEngine.decide
    def decide(self, *a, **k):
        blob = pickle.dumps((self, a, k))
        result = orig(self, *a, **k)
        captured.append((blob, 0.0, result.plan, result.step))
        return result
    E.PolicyEngine.decide = decide
    spec = build_task(task)
    torch.manual_seed(0)
    ddp = DDP(spec.build_model(), init_sync=False)
    ctl = autocomp.wrap(ddp, target_overlap=0.9, run_dir=False)
    opt = spec.make_optimizer(ddp.parameters())
    for step in range(steps):
        x, y = spec.batch(rank, step, 1)
        loss = spec.loss(ddp(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        ctl.observe_loss(float(loss.item()))
        e = torch.tensor([time.perf_counter()], dtype=torch.float64); dist.all_reduce(e, op=dist.ReduceOp.MAX)
    ctl.close()
    if rank == 0:
        pickle.dump(captured, open(out, "wb"))
        print("captured", [(c[3], sorted(set(c[2].values()))) for c in captured])
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(tempfile.mktemp(), sys.argv[1], int(sys.argv[2]), sys.argv[3]), nprocs=2)
