"""Same plan, static against adaptive machinery: 2 gloo ranks (loopback), one tta task, every
layer pinned to SPEC; modes: static (autocomp.wrap(ddp, plan=...)), pinned (the same plan with
target_overlap=0.9: profiler, sampled steps, boundaries, probes), adaptive (the real thing).
Interleaved rounds; median step per mode and round, steps after the first 20.
    PYTHONPATH=. python pinned.py TASK SPEC STEPS ROUNDS OUT.json"""
import datetime, json, statistics, sys, tempfile, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
from autocomp_bench.overhead import _workload
MODES = ("static", "pinned")

def run(mode, rank, steps, task, spec):
    torch.manual_seed(0)
    model, make_opt, batch, loss_fn = _workload(task)
    ddp = DDP(model)
    if mode == "static":
        ctl = autocomp.wrap(ddp, plan={"*": spec}, warmup_steps=2)
    else:
        ctl = autocomp.wrap(ddp, plan={"*": spec}, target_overlap=0.9, warmup_steps=2)
    opt = make_opt(ddp.parameters()); times = []
    for step in range(steps):
        x, y = batch(rank, step)
        s = time.perf_counter()
        loss = loss_fn(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
        ctl.observe_loss(loss)
        times.append(time.perf_counter() - s)
    extra = {}
    if ctl.adaptive is not None:
        extra = {"boundary_s": ctl.adaptive.boundary_seconds, "opening_s": ctl.adaptive.opening_seconds}
    ctl.close()
    return {"times": times, **extra}

def main(rank, world, store, task, spec, steps, rounds, path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    res = []
    for r in range(rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        res.append({m: run(m, rank, steps, task, spec) for m in order})
    if rank == 0:
        json.dump(res, open(path, "w"))
        for i, x in enumerate(res):
            s, p = (statistics.median(x[m]["times"][20:]) for m in MODES)
            print(f"round {i}: static {s*1e3:.1f} ms, pinned {p*1e3:.1f} ms ({p/s:.3f}x); pinned boundaries {x['pinned']['boundary_s']:.3f} s, opening {x['pinned']['opening_s']:.3f} s; totals static {sum(x['static']['times']):.2f} pinned {sum(x['pinned']['times']):.2f} s")
    dist.destroy_process_group()

if __name__ == "__main__":
    task, spec, steps, rounds, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    mp.spawn(main, args=(2, tempfile.mktemp(), task, spec, steps, rounds, path), nprocs=2)
