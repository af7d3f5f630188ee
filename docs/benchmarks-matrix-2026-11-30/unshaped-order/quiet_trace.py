"""Why the quiet stretch does not start: mlp-lm, 2 gloo ranks on loopback, adaptive, STEPS
steps; at every boundary rank 0 prints which of _quiet_windows' conditions held."""
import datetime, os, sys, tempfile, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def main(rank, store, steps):
    import autocomp, autocomp.adaptive as A
    from autocomp.policy.types import NONE_SPEC
    from autocomp_bench.tasks import build_task
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    orig = A.AdaptiveLoop._quiet_windows
    def traced(self, update, current, measurement):
        n = orig(self, update, current, measurement)
        why = {
            "warmup_done": self.planner.warmup_done, "probe_bytes": update.probe_bytes,
            "resets": len(update.resets), "window_steps": update.window_steps,
            "guard_events": len(update.record.guard_events), "frozen": self.planner.frozen,
            "all_none_held": not any(s != NONE_SPEC or current[nm] != s for nm, s in zip(self.names, update.plan)),
            "warmup_peers": bool(self.warmup_peers), "hierarchy": self.state.hierarchy is not None,
        }
        print(f"step {measurement.step}: quiet {n} {why}", flush=True)
        return n
    A.AdaptiveLoop._quiet_windows = traced
    spec = build_task("mlp-lm")
    torch.manual_seed(1)
    ddp = DDP(spec.build_model())
    ctl = autocomp.wrap(ddp, target_overlap=0.9)
    opt = spec.make_optimizer(ddp.parameters())
    for step in range(steps):
        x, y = spec.batch(rank, step, 1)
        loss = spec.loss(ddp(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        ctl.observe_loss(loss.detach())
    ctl.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, args=(tempfile.mktemp(), int(sys.argv[1])), nprocs=2)
