"""World-1 gloo DDP, static fp16:ef=false everywhere: step time of autocomp's generic span path
and its whole-bucket path, stepped in turn with PyTorch's fp16 hook and plain DDP."""
import datetime, statistics, sys, tempfile, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp, autocomp.hook as H
from autocomp_bench.tasks import build_task
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
torch.set_num_threads(1)
d = tempfile.mkdtemp()
dist.init_process_group("gloo", store=dist.FileStore(d + "/s", 1), rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
spec = build_task(sys.argv[1])
whole = H.whole_bucket_span
def make(mode):
    torch.manual_seed(0)
    model = spec.build_model(); ddp = DDP(model)
    if mode.startswith("autocomp"):
        autocomp.wrap(ddp, plan={"*": "fp16:ef=false"})
    elif mode == "torch fp16 hook":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return model, ddp, spec.make_optimizer(ddp.parameters())
modes = ["ddp", "torch fp16 hook", "autocomp generic", "autocomp whole"]
built = {m: make(m) for m in modes}
times = {m: [] for m in modes}
for step in range(int(sys.argv[2])):
    for m in (modes if step % 2 else modes[::-1]):
        H.whole_bucket_span = whole if m == "autocomp whole" else (lambda *a: None)
        model, ddp, opt = built[m]
        x, y = spec.batch(0, step, 1)
        t0 = time.perf_counter()
        loss = spec.loss(ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        times[m].append(time.perf_counter() - t0)
p = {m: torch.cat([q.detach().reshape(-1) for q in built[m][0].parameters()]) for m in modes}
print(sys.argv[1], "generic == whole parameters:", torch.equal(p["autocomp generic"], p["autocomp whole"]),
      "== torch fp16 hook:", torch.equal(p["autocomp whole"], p["torch fp16 hook"]))
for m in modes:
    rel = statistics.median(a / b for a, b in zip(times[m][10:], times["ddp"][10:]))
    print(f"{sys.argv[1]:14s} {m:18s} median {statistics.median(times[m][10:])*1e3:7.2f} ms  paired vs ddp {rel:.3f}")
