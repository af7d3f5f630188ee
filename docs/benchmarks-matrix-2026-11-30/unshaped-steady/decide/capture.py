"""Capture PolicyEngine.decide inputs (pickled engine + arguments) on rank 0 of an adaptive run
over a tbf-shaped link.   python capture.py TASK RATE_MBIT STEPS OUT.pkl"""
import datetime, os, pickle, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def worker(task, steps, out):
    import autocomp
    import autocomp.policy.engine as E
    from autocomp_bench.tasks import build_task
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    captured = []
    orig = E.PolicyEngine.decide
    def decide(self, *a, **k):
        blob = pickle.dumps((self, a, k))
        t = time.perf_counter()
        result = orig(self, *a, **k)
        captured.append((blob, time.perf_counter() - t, result.plan, result.step))
        return result
    E.PolicyEngine.decide = decide
    spec = build_task(task)
    torch.manual_seed(0)
    ddp = DDP(spec.build_model())
    ctl = autocomp.wrap(ddp, target_overlap=0.9, run_dir=False)
    opt = spec.make_optimizer(ddp.parameters())
    for step in range(steps):
        x, y = spec.batch(rank, step, 0)
        loss = spec.loss(ddp(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    ctl.close()
    if rank == 0:
        with open(out, "wb") as f:
            pickle.dump(captured, f)
        print("captured", len(captured), "decisions; seconds", [round(c[1] * 1e3, 1) for c in captured])
    dist.destroy_process_group()

if __name__ == "__main__":
    if os.environ.get("CAP_WORKER"):
        worker(sys.argv[1], int(sys.argv[3]), sys.argv[4]); sys.exit(0)
    from autocomp_bench.shaped_link import ShapedLink
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=float(sys.argv[2]))) as link:
        procs = [link.popen(h, [sys.executable, *sys.argv],
                            env={**link.rank_env(h, world_size=2, master_port=29541), "CAP_WORKER": "1", "PYTHONPATH": "/work/main"})
                 for h in range(2)]
        print("exit codes", [p.wait(timeout=900) for p in procs])
