"""Per-step DDP runtime stats without a hook, on each tta task, unshaped loopback."""
import os, sys, time, statistics
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from autocomp_bench.tasks import build_task
rank = int(os.environ["RANK"]); task = build_task(sys.argv[1])
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
ddp = DDP(task.build_model())
ddp._set_ddp_runtime_logging_sample_rate(1)
opt = task.make_optimizer(ddp.parameters())
rows = []; costs = []
for s in range(int(sys.argv[2])):
    x, y = task.batch(rank, s, 0)
    t0 = time.perf_counter()
    loss = task.loss(ddp(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    t1 = time.perf_counter()
    d = ddp._get_ddp_logging_data()
    costs.append(time.perf_counter() - t1)
    rows.append((t1 - t0, d.get("forward_compute_time", 0)/1e6, d.get("backward_compute_time", 0)/1e6, d.get("backward_comm_time", 0)/1e6, d.get("backward_compute_comm_overlap_time", 0)/1e6))
if rank == 0:
    print(sorted(k for k in d if "time" in k or "iter" in k or "sample" in k))
    for r in rows[:4] + rows[-3:]:
        print("step %.1f fwd %.1f bwd %.1f comm %.1f overlap %.1f exposed %.1f" % (r[0]*1e3, *r[1:], r[3]-r[4]))
    med = lambda i: statistics.median(r[i] for r in rows[5:])
    print("median step %.2f fwd %.2f bwd %.2f comm %.2f ovl %.2f exposed %.2f; get_data %.0f us" % (med(0)*1e3, med(1), med(2), med(3), med(4), statistics.median(r[3]-r[4] for r in rows[5:]), statistics.median(costs)*1e6))
dist.destroy_process_group()
