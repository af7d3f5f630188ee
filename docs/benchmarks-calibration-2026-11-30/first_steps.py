import statistics, sys, time, logging
import torch, torch.distributed as dist
sys.path.insert(0, ".")
from autocomp_bench.tasks import build_task
from autocomp_bench.worker import attach
task_name, methods, steps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0 and len(sys.argv) > 4:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("autocomp").setLevel(logging.DEBUG)
task = build_task(task_name)
for method in methods:
    torch.manual_seed(0)
    model = task.build_model()
    att = attach(method, model, {"adaptive_kwargs": {"target_overlap": 0.9}, "seed": 0})
    opt = task.make_optimizer(att.ddp.parameters())
    times = []
    for step in range(steps):
        x, y = task.batch(rank, step, 0)
        s = time.perf_counter()
        loss = task.loss(att.ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        loss.item()
        times.append(time.perf_counter() - s)
    if att.ctl is not None:
        att.ctl.close()
    if rank == 0:
        print(method, "first", " ".join(f"{t*1e3:.0f}" for t in times[:8]), "median", f"{statistics.median(times[8:] or [0])*1e3:.1f}", "sum", f"{sum(times):.2f}", flush=True)
    del att, opt, model
    dist.barrier()
dist.destroy_process_group()
