"""Wall time of the hook's parts per step (world-1 gloo DDP, static fp16:ef=false on every tensor)."""
import collections, datetime, statistics, sys, tempfile, time, functools
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp, autocomp.hook as H, autocomp.hook_state as HS, autocomp.attach as A, autocomp.callbacks as C
from autocomp import hook_cast_span
from autocomp_bench.tasks import build_task
torch.set_num_threads(1)
acc = collections.defaultdict(float)
def timed(mod, name, label=None):
    f = getattr(mod, name)
    @functools.wraps(f)
    def w(*a, **k):
        t0 = time.perf_counter()
        try: return f(*a, **k)
        finally: acc[label or name] += time.perf_counter() - t0
    setattr(mod, name, w)
for n in ("encode_bucket", "launch_bucket", "complete_when_done", "_finish", "average_in_place"):
    timed(H, n)
timed(HS.HookState, "enter_hook"); timed(HS.HookState, "layout"); timed(HS.HookState, "resolve_nonfinite")
timed(H, "autocomp_hook", "hook total")
if hasattr(A, "autocomp_hook"): A.autocomp_hook = H.autocomp_hook
d = tempfile.mkdtemp()
dist.init_process_group("gloo", store=dist.FileStore(d + "/s", 1), rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
spec = build_task(sys.argv[1]); model = spec.build_model(); ddp = DDP(model)
hook_cast_span.CAST_SPANS = sys.argv[2] == "spans"
ctl = autocomp.wrap(ddp, plan={"*": "fp16:ef=false"})
opt = spec.make_optimizer(ddp.parameters())
steps = 100
for step in range(steps + 10):
    if step == 10: acc.clear(); t0 = time.perf_counter()
    x, y = spec.batch(0, step, 1)
    loss = spec.loss(ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
print(sys.argv[1:], "step ms", (time.perf_counter() - t0) / steps * 1e3)
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]): print(f"   {k:20s} {v / steps * 1e3:.3f} ms/step")
