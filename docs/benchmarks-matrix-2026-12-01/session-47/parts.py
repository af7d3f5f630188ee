"""Wall time of each part of the opening (probe growth, contention, half sums) on rank 0,
2 ranks over tbf. python parts.py TASK RATE_MBIT RUNS"""
import datetime, os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
def train():
    import autocomp
    from autocomp import opening
    from autocomp_bench.tasks import build_task
    torch.set_num_threads(1)
    rank = dist.get_rank()
    spent = {}
    def timed(name, fn):
        def inner(*a, **k):
            t = time.perf_counter(); r = fn(*a, **k)
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
            return r
        return inner
    R = opening.ProbeRunner
    R.contention = timed("contention", R.contention)
    R.half_sums = timed("half_sums", R.half_sums)
    R.time_all_reduce = timed("growth", R.time_all_reduce)
    rounds = []
    orig_tar = R.time_all_reduce
    def rec(self, size, device, group):
        s = orig_tar(self, size, device, group); rounds.append((size >> 10, round(s * 1e3, 2))); return s
    R.time_all_reduce = rec
    orig_half = R.half_sums
    def half(self, *a, **k):
        r = orig_half(self, *a, **k); rounds.append(("half", a[0] >> 10, round(a[1]*1e3, 2), r)); return r
    R.half_sums = half
    R.opening = timed("opening", R.opening)
    spec = build_task(sys.argv[1]); torch.manual_seed(0)
    ddp = DDP(spec.build_model())
    ctl = autocomp.wrap(ddp, target_overlap=0.9, run_dir=False)
    opt = spec.make_optimizer(ddp.parameters())
    for step in range(3):
        t0 = time.perf_counter()
        x, y = spec.batch(rank, step, 1)
        loss = spec.loss(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
        ctl.observe_loss(float(loss.item()))
        if step == 0:
            s0 = time.perf_counter() - t0
    if rank == 0:
        print("PARTS step0 %.3f " % s0 + " ".join(f"{k} {v:.3f}" for k, v in spent.items()) + f" rounds {rounds}", flush=True)
    ctl.close(); dist.destroy_process_group()
if __name__ == "__main__":
    if os.environ.get("CAP_WORKER"):
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120)); train()
    else:
        from autocomp_bench.shaped_link import ShapedLink
        with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=float(sys.argv[2]))) as link:
            env = {"CAP_WORKER": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
            for _ in range(int(sys.argv[3])):
                procs = [link.popen(h, [sys.executable, *sys.argv], env={**link.rank_env(h, world_size=2, master_port=29543), **env}) for h in range(2)]
                [p.wait(timeout=300) for p in procs]
