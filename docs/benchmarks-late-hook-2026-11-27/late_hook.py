"""Can a comm hook be registered after DDP has trained (bucket rebuild done)? Does DDP's own
runtime logging time the backward's communication on CPU gloo without a hook?"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
ddp = DDP(model, bucket_cap_mb=1)
ddp._set_ddp_runtime_logging_sample_rate(1)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)


def step() -> None:
    x = torch.randn(32, 512)
    opt.zero_grad()
    ddp(x).sum().backward()
    opt.step()


def timings() -> dict[str, int]:
    return {k: v for k, v in ddp._get_ddp_logging_data().items() if "time" in k}


for _ in range(12):
    step()
if rank == 0:
    print(timings())

calls: list[int] = []


def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    calls.append(bucket.index())
    fut = dist.all_reduce(bucket.buffer().div_(2), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


ddp.register_comm_hook(None, hook)
for _ in range(3):
    step()
if rank == 0:
    print("hook calls after late registration:", calls)
    print(timings())
dist.destroy_process_group()
