"""Native FSDP2 HSDP (2x2 mesh, gloo): a submodule that never runs on one replica."""
import datetime, os, sys, tempfile, time, traceback
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 4)
    def forward(self, x, skip):
        h = torch.relu(self.a(x))
        if not skip:
            h = torch.relu(self.b(h))
        return self.c(h)

def run(rank, world, path, mode):
    dist.init_process_group("gloo", store=dist.FileStore(path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=15))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    net = Net()
    for m in (net.a, net.b, net.c):
        fully_shard(m, mesh=mesh)
    fully_shard(net, mesh=mesh)
    replica = mesh.get_local_rank("replicate")
    skip = replica == 1 and mode == "skip_replica"
    t0 = time.time()
    try:
        for step in range(3):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank * 100 + step))
            net(x, skip).sum().backward()
        w = net.b.weight.full_tensor()
        print(f"rank {rank} replica {replica} ok after {time.time()-t0:.1f}s; b.weight sum {float(w.sum()):.6f}; grad {'none' if net.b.weight.grad is None else 'set'}", flush=True)
    except Exception as err:
        print(f"rank {rank} replica {replica} raised after {time.time()-t0:.1f}s: {type(err).__name__}: {str(err)[:200]}", flush=True)
    os._exit(0)

if __name__ == "__main__":
    mode = sys.argv[1]
    path = tempfile.mktemp()
    mp.spawn(run, args=(4, path, mode), nprocs=4, join=True)
