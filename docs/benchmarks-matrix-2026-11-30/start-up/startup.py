"""Where adaptive's first steps go on a fast link: 2 gloo ranks (loopback), one tta task, DDP
and autocomp.wrap(ddp, target_overlap=0.9) interleaved; per-step times of the first STEPS steps
(step 0 included), the opening's and the boundaries' seconds.
    PYTHONPATH=. python startup.py TASK STEPS ROUNDS OUT.json"""
import datetime, json, statistics, sys, tempfile, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
from autocomp_bench.overhead import _workload

def run(mode, rank, steps, task):
    torch.manual_seed(0)
    model, make_opt, batch, loss_fn = _workload(task)
    ddp = DDP(model); ctl = None
    wrap_s = 0.0
    if mode == "adaptive":
        s = time.perf_counter()
        ctl = autocomp.wrap(ddp, target_overlap=0.9)
        wrap_s = time.perf_counter() - s
    opt = make_opt(ddp.parameters()); times = []
    for step in range(steps):
        x, y = batch(rank, step)
        s = time.perf_counter()
        loss = loss_fn(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
        if ctl is not None: ctl.observe_loss(loss)
        times.append(time.perf_counter() - s)
    out = {"times": times, "wrap_s": wrap_s}
    if ctl is not None:
        a = ctl.adaptive
        out.update(opening_s=a.opening_seconds, boundary_s=a.boundary_seconds)
        ctl.close()
    return out

def main(rank, world, store, task, steps, rounds, path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    res = []
    for r in range(rounds):
        order = ("ddp", "adaptive") if r % 2 == 0 else ("adaptive", "ddp")
        res.append({m: run(m, rank, steps, task) for m in order})
    if rank == 0:
        json.dump(res, open(path, "w"))
        for i, x in enumerate(res):
            d, a = x["ddp"]["times"], x["adaptive"]["times"]
            print(f"round {i}: wrap {x['adaptive']['wrap_s']:.3f} s, opening {x['adaptive']['opening_s']:.3f} s, boundaries {x['adaptive']['boundary_s']:.3f} s")
            print(f"  step0 ddp {d[0]:.3f} adaptive {a[0]:.3f}; steps 1-16 ddp {sum(d[1:17]):.3f} adaptive {sum(a[1:17]):.3f}; steps 17-{len(d)-1} ddp {sum(d[17:]):.3f} adaptive {sum(a[17:]):.3f}")
            print("  adaptive-ddp per step 0-20 (ms): " + " ".join(f"{(y-z)*1e3:.0f}" for y, z in zip(a[:21], d[:21])))
    dist.destroy_process_group()

if __name__ == "__main__":
    task, steps, rounds, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    mp.spawn(main, args=(2, tempfile.mktemp(), task, steps, rounds, path), nprocs=2)
