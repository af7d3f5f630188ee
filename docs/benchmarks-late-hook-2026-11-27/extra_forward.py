import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
r = dist.get_rank()
m = DDP(torch.nn.Linear(8, 8))
for step in range(4):
    m(torch.randn(2, 8)).sum().backward()
    if r == 0 and step == 1:
        m(torch.randn(2, 8))  # an extra training forward, grad enabled, no backward
print(r, "ok, reducer iterations", m._get_ddp_logging_data().get("iteration"), flush=True)
dist.destroy_process_group()
