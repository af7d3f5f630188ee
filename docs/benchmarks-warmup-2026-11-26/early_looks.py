import datetime, sys, tempfile
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
from autocomp_bench.tasks import build_task
TASK = sys.argv[1]; STEPS = int(sys.argv[2])
def main(rank, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
    task = build_task(TASK)
    torch.manual_seed(0)
    ddp = DDP(task.build_model(), init_sync=False)
    ctl = autocomp.wrap(ddp, target_overlap=0.9)
    opt = task.make_optimizer(ddp.parameters())
    for step in range(STEPS):
        x, y = task.batch(rank, step, 0)
        loss = task.loss(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
    if rank == 0:
        for r in ctl.history:
            d = r.decision or {}
            plan = {l["name"]: l["spec"] for l in d.get("layers", []) if l["spec"] != "none"}
            print(f"{r.step:4d} step {r.step_seconds*1e3:6.2f} comp {r.compute_seconds*1e3:6.2f} exp {r.exposed_seconds*1e3:6.2f} busy {r.comm_busy_seconds*1e3:6.2f} work {r.compress_seconds*1e3:5.2f} bw {(r.bandwidth_bytes_per_s or 0)/1e6:7.0f} {d.get('solver','')[:30]} {plan}")
    ctl.close()
    dist.destroy_process_group()
if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(main, args=(f"{d}/s",), nprocs=2, start_method="spawn")
