"""Per-step timeline on rank 0: hook calls, all-reduce launch/complete, backward end."""
import functools, statistics, sys, time, threading, collections, json
import torch, torch.distributed as dist
sys.path.insert(0, ".")
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
import autocomp.hook as H
import autocomp.attach as A
from autocomp_bench.tasks import build_task
from autocomp_bench.worker import attach
methods, steps = sys.argv[1].split(","), int(sys.argv[2])
T0 = [0.0]
ev = []
def now(): return (time.perf_counter() - T0[0]) * 1e3
def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        ev.append((name + ">", now(), threading.current_thread() is threading.main_thread()))
        try:
            return fn(*a, **k)
        finally:
            ev.append((name + "<", now(), threading.current_thread() is threading.main_thread()))
    return wrapper
orig_ar = dist.all_reduce
def ar(tensor, *a, **k):
    t = now()
    work = orig_ar(tensor, *a, **k)
    n = tensor.numel() * tensor.element_size()
    ev.append((f"AR{n//1000}k launch", t, True))
    if work is not None and k.get("async_op"):
        fut = work.get_future()
        def done(f, n=n):
            ev.append((f"AR{n//1000}k done", now(), False)); return f.value()
        # observe without changing value: add_done_callback
        fut.add_done_callback(lambda f, n=n: ev.append((f"AR{n//1000}k done", now(), False)))
    return work
dist.all_reduce = ar
H.dist.all_reduce = ar
default_hooks.dist.all_reduce = ar
for name in ("encode_bucket", "launch_bucket", "_finish", "average_in_place"):
    if hasattr(H, name): setattr(H, name, timed(name, getattr(H, name)))
H.autocomp_hook = timed("HOOK", H.autocomp_hook)
A.autocomp_hook = H.autocomp_hook
orig_fp16 = default_hooks.fp16_compress_hook
default_hooks.fp16_compress_hook = timed("HOOK", orig_fp16)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
task = build_task("gpt")
out = {}
for method in methods:
    torch.manual_seed(0); model = task.build_model()
    if method.startswith("plan:"):
        att = attach("static", model, {"plan": json.load(open(method[5:])), "seed": 0})
    else:
        att = attach(method, model, {"seed": 0})
    opt = task.make_optimizer(att.ddp.parameters())
    rows = []
    for step in range(steps):
        x, y = task.batch(rank, step, 0)
        ev.clear(); T0[0] = time.perf_counter()
        out_ = att.ddp(x); loss = task.loss(out_, y); opt.zero_grad(set_to_none=True)
        ev.append(("bwd>", now(), True))
        loss.backward()
        ev.append(("bwd<", now(), True))
        opt.step()
        ev.append(("end", now(), True))
        rows.append(list(ev))
    if att.ctl is not None: att.ctl.close()
    dist.barrier()
    out[method] = rows[steps // 2:]
if rank == 0:
    for method, rows in out.items():
        print("=====", method, "median end %.2f" % statistics.median(r[-1][1] for r in rows))
        # median time of each event label (by order index)
        for r in rows[-3:]:
            print("  --", " ".join(f"{n}@{t:.1f}{'' if m else '*'}" for n, t, m in r))
dist.destroy_process_group()
