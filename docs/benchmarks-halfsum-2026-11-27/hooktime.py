"""Main-thread seconds inside the comm hook and callback-thread seconds in the decode, per step."""
import functools, statistics, sys, time, threading, collections
import torch, torch.distributed as dist
sys.path.insert(0, ".")
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
import autocomp.hook as H
import autocomp.attach as A
from autocomp_bench.tasks import build_task
from autocomp_bench.worker import attach
method, steps = sys.argv[1], int(sys.argv[2])
acc = collections.Counter()
def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        s = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[name + ("" if threading.current_thread() is threading.main_thread() else "@cb")] += time.perf_counter() - s
    return wrapper
for name in ("encode_bucket", "launch_bucket", "_finish", "complete_when_done", "average_in_place", "_flat", "_all_reduce"):
    setattr(H, name, timed(name, getattr(H, name)))
H.autocomp_hook = timed("autocomp_hook", H.autocomp_hook)
A.autocomp_hook = H.autocomp_hook
orig_fp16 = default_hooks.fp16_compress_hook
default_hooks.fp16_compress_hook = timed("fp16_hook", orig_fp16)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
task = build_task("gpt"); torch.manual_seed(0); model = task.build_model()
if method.startswith("static:"):
    name, spec = method.removeprefix("static:").split("=", 1)
    att = attach("static", model, {"plan": {name: spec}, "seed": 0})
else:
    att = attach(method, model, {"seed": 0})
opt = task.make_optimizer(att.ddp.parameters())
times = []
for step in range(steps):
    if step == steps // 4: acc.clear()
    x, y = task.batch(rank, step, 0)
    s = time.perf_counter()
    loss = task.loss(att.ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    times.append(time.perf_counter() - s)
n = steps - steps // 4
if rank == 0:
    print(method, "median %.2f ms" % (statistics.median(times[steps // 4:]) * 1e3), {k: round(v / n * 1e3, 3) for k, v in acc.items()})
dist.destroy_process_group()
