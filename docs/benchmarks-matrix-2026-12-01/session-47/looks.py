"""The warm-up looks' measured multiple (uncompressed step / compute-only) at steps 1-32 on
rank 0, 2 ranks over tbf, RUNS fresh runs. python looks.py TASK RATE_MBIT RUNS STEPS"""
import datetime, os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
def train():
    import autocomp
    from autocomp import planner as pl
    from autocomp_bench.tasks import build_task
    torch.set_num_threads(1)
    rank = dist.get_rank()
    seen = []
    orig = pl.WindowPlanner._dominance
    def dom(self, m):
        t = m.timings; compute = pl._compute(t)
        ran = {name: layer.spec for name, layer in m.layers.items()}
        step = pl._uncompressed_step(m, compute, self.half_sum_seconds(ran))
        seen.append((m.step, round(step / compute, 2) if compute > 0 else None, round(1e3 * t["step_seconds"]), round(1e3 * compute)))
        return orig(self, m)
    pl.WindowPlanner._dominance = dom
    spec = build_task(sys.argv[1]); torch.manual_seed(0)
    ddp = DDP(spec.build_model())
    ctl = autocomp.wrap(ddp, target_overlap=0.9, run_dir=False)
    opt = spec.make_optimizer(ddp.parameters())
    for step in range(int(sys.argv[4])):
        x, y = spec.batch(rank, step, 1)
        loss = spec.loss(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
        ctl.observe_loss(float(loss.item()))
    if rank == 0:
        print("LOOKS", seen, "warmup_done", ctl._loop.planner.warmup_done if hasattr(ctl, "_loop") else "?", flush=True)
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
