"""World 1: static fp16 against adaptive with the plan pinned to fp16, stepped in turn; wall time of
adaptive's per-step pieces (wrappers)."""
import collections, datetime, functools, statistics, sys, tempfile, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp, autocomp.adaptive as AD, autocomp.profiler as PR, autocomp.hook_cast_span as HC
from autocomp_bench.tasks import build_task
torch.set_num_threads(1)
acc = collections.defaultdict(float); cnt = collections.Counter()
def timed(owner, name):
    f = getattr(owner, name)
    @functools.wraps(f)
    def w(*a, **k):
        t0 = time.perf_counter()
        try: return f(*a, **k)
        finally: acc[name] += time.perf_counter() - t0; cnt[name] += 1
    setattr(owner, name, w)
for n in ("on_step_start", "_boundary"): timed(AD.AdaptiveLoop, n)
for n in ("begin_step", "hook_entered", "hook_exited", "shared_cost", "launched", "bucket_finished", "forward_done"): timed(PR.StepProfiler, n)
d = tempfile.mkdtemp()
dist.init_process_group("gloo", store=dist.FileStore(d + "/s", 1), rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
spec = build_task(sys.argv[1])
def make(mode):
    torch.manual_seed(0); model = spec.build_model(); ddp = DDP(model)
    ctl = autocomp.wrap(ddp, plan={"*": "fp16:ef=false"}) if mode == "static" else autocomp.wrap(ddp, target_overlap=0.9, plan={"*": "fp16:ef=false"})
    return model, ddp, spec.make_optimizer(ddp.parameters()), ctl
modes = ["static", "adaptive"]
built = {m: make(m) for m in modes}; times = {m: [] for m in modes}
N = int(sys.argv[2])
for step in range(N):
    if step == 20: acc.clear(); cnt.clear()
    for m in (modes if step % 2 else modes[::-1]):
        model, ddp, opt, ctl = built[m]; x, y = spec.batch(0, step, 1)
        t0 = time.perf_counter(); loss = spec.loss(ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        if m == "adaptive": ctl.observe_loss(loss.detach())
        times[m].append(time.perf_counter() - t0)
print("adaptive/static median", statistics.median(a / b for a, b in zip(times["adaptive"][20:], times["static"][20:])), "static ms", statistics.median(times["static"][20:]) * 1e3)
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]): print(f"  {k:18s} {v / (N - 20) * 1e3:.4f} ms/step  ({cnt[k]} calls)")
