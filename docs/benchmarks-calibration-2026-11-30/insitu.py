# Pin each candidate on the ngram table in turn; compare the cost model's price (calibrated prior,
# before any sample) with the hook's measured per-step cost samples.
import statistics, sys, time, math
import torch, torch.distributed as dist
sys.path.insert(0, ".")
from autocomp_bench.tasks import build_task
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
task = build_task(sys.argv[1]); layer = sys.argv[2]; steps = int(sys.argv[3])
specs = sys.argv[4].split(";")
for spec in specs:
    torch.manual_seed(0)
    model = task.build_model()
    ddp = DDP(model, init_sync=False)
    ctl = autocomp.wrap(ddp, target_overlap=0.9, plan={layer: spec})
    opt = task.make_optimizer(ddp.parameters())
    planner = ctl.adaptive.planner
    cm = planner.cost_model
    shape = dict(model.named_parameters())[layer].shape
    price0 = None
    times = []
    for step in range(steps):
        if step == 0:
            pass
        x, y = task.batch(rank, step, 0)
        s = time.perf_counter()
        loss = task.loss(ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); loss.item()
        times.append(time.perf_counter() - s)
        if step == 1 and rank == 0:
            price0 = cm.compress_seconds(spec, shape)
    if rank == 0:
        sd = cm.state_dict()
        print(spec, [(x["spec"], x["shape"], len(x["seconds"])) for x in sd["groups"]], dict(list(ctl.plan.items())[:2]) if hasattr(ctl,"plan") else None, flush=True)
        print(f"STEP {spec:28s} step median {statistics.median(times[10:])*1e3:.1f}", flush=True)
        g = [x for x in sd["groups"] if x["spec"].startswith(spec.split(":")[0])]
        for x in g:
            v = x["seconds"]
            print(f"{spec:28s} price@1 {price0*1e3:7.2f} ms  samples n={len(v)} median {statistics.median(v)*1e3:7.2f} ms  [{', '.join(f'{t*1e3:.1f}' for t in v[:12])}]  step median {statistics.median(times[10:])*1e3:.1f}", flush=True)
    ctl.close()
    del ctl, ddp, opt, model
    dist.barrier()
dist.destroy_process_group()
