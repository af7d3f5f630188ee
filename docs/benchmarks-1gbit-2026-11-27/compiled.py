import sys, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
plan = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
ddp = DDP(net)
ctl = autocomp.wrap(ddp, target_overlap=0.9) if plan == "adaptive" else autocomp.wrap(ddp, plan={"*weight": plan})
model = torch.compile(ddp, backend=sys.argv[2] if len(sys.argv) > 2 else "inductor")
opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(rank)
for step in range(30):
    x = torch.randn(16, 32, generator=g); y = torch.randint(0, 10, (16,), generator=g)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
lo, hi = flat.clone(), flat.clone()
dist.all_reduce(lo, op=dist.ReduceOp.MIN); dist.all_reduce(hi, op=dist.ReduceOp.MAX)
st = ctl.stats()
ctl.close()
if rank == 0:
    print(plan, "loss %.4f" % loss.item(), "identical:", torch.equal(lo, hi), "ratio", round(st.get("compression_ratio", 0), 2))
dist.destroy_process_group()
