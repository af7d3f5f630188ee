import statistics, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, ".")
from autocomp_bench.tasks import build_task
from autocomp_bench.worker import attach
method, steps = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
task = build_task("gpt")
torch.manual_seed(0)
model = task.build_model()
if method.startswith("static:"):
    name, spec = method.removeprefix("static:").split("=", 1)
    att = attach("static", model, {"plan": {name: spec}, "seed": 0})
else:
    att = attach(method, model, {"seed": 0})
opt = task.make_optimizer(att.ddp.parameters())
times = []
for step in range(steps):
    x, y = task.batch(rank, step, 0)
    s = time.perf_counter()
    loss = task.loss(att.ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    times.append(time.perf_counter() - s)
if rank == 0:
    print(method, "median ms %.2f" % (statistics.median(times[steps // 4:]) * 1e3))
dist.destroy_process_group()
