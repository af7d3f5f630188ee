"""autocomp under DDP options users set: static_graph, find_unused_parameters, channels_last."""
import sys, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
mode, plan = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.a = nn.Linear(16 * 8 * 8, 64)
        self.b = nn.Linear(64, 10)
        self.unused = nn.Linear(64, 10) if mode == "unused" else None
    def forward(self, x, step=0):
        h = torch.relu(self.conv(x)).flatten(1)
        h = torch.relu(self.a(h))
        out = self.b(h)
        if mode == "unused" and (step + rank) % 3 == 0:
            out = out + self.unused(h)
        return out
net = Net()
if mode == "channels_last":
    net = net.to(memory_format=torch.channels_last)
kw = {}
if mode == "static":
    kw["static_graph"] = True
if mode == "unused":
    kw["find_unused_parameters"] = True
ddp = DDP(net, **kw)
ctl = autocomp.wrap(ddp, target_overlap=0.9) if plan == "adaptive" else autocomp.wrap(ddp, plan={"*weight": plan})
opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(rank)
for step in range(40):
    x = torch.randn(8, 3, 8, 8, generator=g)
    if mode == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (8,), generator=g)
    loss = nn.functional.cross_entropy(ddp(x, step) if mode == "unused" else ddp(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
lo, hi = flat.clone(), flat.clone()
dist.all_reduce(lo, op=dist.ReduceOp.MIN); dist.all_reduce(hi, op=dist.ReduceOp.MAX)
ctl.close()
if rank == 0:
    print(mode, plan, "loss %.4f" % loss.item(), "ranks identical:", torch.equal(lo, hi))
dist.destroy_process_group()
