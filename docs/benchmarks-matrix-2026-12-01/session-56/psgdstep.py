"""World-1 gloo DDP: autocomp static PowerSGD rank 4 against PyTorch's powerSGD_hook rank 4 (one
bucket, error feedback, warm start), stepped in turn with plain DDP (run from the tree under test)."""
import datetime, json, statistics, sys, tempfile, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
from autocomp_bench.tasks import build_task
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
torch.set_num_threads(1)
d = tempfile.mkdtemp()
dist.init_process_group("gloo", store=dist.FileStore(d + "/s", 1), rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
spec = build_task(sys.argv[1])
plan = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {"*": "powersgd:rank=4"}
def make(mode):
    torch.manual_seed(0)
    model = spec.build_model()
    if mode == "torch psgd hook":
        ddp = DDP(model, bucket_cap_mb=10_000)
        st = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2,
                                         use_error_feedback=True, warm_start=True, random_seed=0)
        ddp.register_comm_hook(st, powerSGD_hook.powerSGD_hook)
    else:
        ddp = DDP(model)
        if mode == "autocomp":
            autocomp.wrap(ddp, plan=plan)
    return model, ddp, spec.make_optimizer(ddp.parameters())
modes = ["ddp", "torch psgd hook", "autocomp"]
built = {m: make(m) for m in modes}
times = {m: [] for m in modes}
for step in range(int(sys.argv[2])):
    for m in (modes if step % 2 else modes[::-1]):
        model, ddp, opt = built[m]
        x, y = spec.batch(0, step, 1)
        t0 = time.perf_counter()
        loss = spec.loss(ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        times[m].append(time.perf_counter() - t0)
out = {m: statistics.median(a / b for a, b in zip(times[m][10:], times["ddp"][10:])) for m in modes}
out["ddp_ms"] = statistics.median(times["ddp"][10:]) * 1e3
out["autocomp_over_hook"] = statistics.median(a / b for a, b in zip(times["autocomp"][10:], times["torch psgd hook"][10:]))
print(json.dumps({"task": sys.argv[1], "tree": sys.argv[3], "plan": plan, **out}))
