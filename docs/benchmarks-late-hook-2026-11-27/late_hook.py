"""Can a comm hook be registered after DDP has trained (bucket rebuild done)? Does DDP's own
runtime logging time the backward's communication on CPU gloo without a hook?"""
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
torch.manual_seed(0)
m = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
ddp = DDP(m, bucket_cap_mb=1)
ddp._set_ddp_runtime_logging_sample_rate(1)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
def step(i):
    x = torch.randn(32, 512)
    opt.zero_grad(); ddp(x).sum().backward(); opt.step()
for i in range(12):
    step(i)
d = ddp._get_ddp_logging_data()
if rank == 0:
    print({k: v for k, v in d.items() if "time" in k})
calls = []
def hook(state, bucket):
    calls.append(bucket.index())
    return dist.all_reduce(bucket.buffer().div_(2), async_op=True).get_future().then(lambda f: f.value()[0])
ddp.register_comm_hook(None, hook)
for i in range(3):
    step(i)
if rank == 0:
    print("hook calls after late registration:", calls)
d = ddp._get_ddp_logging_data()
if rank == 0:
    print({k: v for k, v in d.items() if "time" in k})
dist.destroy_process_group()
