# Scratch check (docs/benchmarks.md, twenty-first session): the gpt task's DDP buckets before
# and after the rebuild at iteration 1 (one process, gloo, world size 1).
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
os.environ.setdefault("MASTER_ADDR","127.0.0.1"); os.environ.setdefault("MASTER_PORT","29611")
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=0, world_size=1)
from autocomp_bench.tasks import build_task
task = build_task("gpt"); torch.manual_seed(0); model = task.build_model()
ddp = DDP(model)
names = {p: n for n, p in model.named_parameters()}
seen = []
def hook(state, bucket):
    seen.append((bucket.index(), [names[p] for p in bucket.parameters()], bucket.buffer().numel()*4))
    fut = torch.futures.Future(); fut.set_result(bucket.buffer()); return fut
ddp.register_comm_hook(None, hook)
opt = task.make_optimizer(ddp.parameters())
for step in range(3):
    seen.clear()
    x, y = task.batch(0, step, 0)
    task.loss(ddp(x), y).backward(); opt.step(); opt.zero_grad()
    print("step", step, [(i, round(b/1e6,3), len(ps), ps[:3]) for i, ps, b in seen])
dist.destroy_process_group()
