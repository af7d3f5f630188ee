"""Median step of one tta task under several methods, in turn, in one process pair.

Run from the repository root (see README.md here):

    torchrun --standalone --nproc_per_node 2 steps.py TASK METHODS STEPS ROUNDS [EXTRAS]
"""

import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, ".")  # the repository root
from autocomp_bench.tasks import build_task
from autocomp_bench.worker import attach

task_name, methods, steps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
extras = set(sys.argv[5].split(",")) if len(sys.argv) > 5 else set()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
task = build_task(task_name)
medians: dict[str, list[float]] = {m: [] for m in methods}
for _ in range(rounds):
    for method in methods:
        torch.manual_seed(0)
        model = task.build_model()
        if method == "static-none":  # autocomp's hook, no window loop
            att = attach("static", model, {"plan": {"*": "none"}, "seed": 0})
        else:
            att = attach(method, model, {"adaptive_kwargs": {"target_overlap": 0.9}, "seed": 0})
        opt = task.make_optimizer(att.ddp.parameters())
        times = []
        for step in range(steps):
            x, y = task.batch(rank, step, 0)
            started = time.perf_counter()
            loss = task.loss(att.ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if "item" in extras:
                value = float(loss.item())
                if "observe" in extras and att.ctl is not None:
                    att.ctl.observe_loss(value)
            if "clock" in extras:  # the tta worker's clock agreement
                clock = torch.tensor([time.perf_counter()], dtype=torch.float64)
                dist.all_reduce(clock, op=dist.ReduceOp.MAX)
            times.append(time.perf_counter() - started)
        if att.ctl is not None:
            att.ctl.close()
        medians[method].append(statistics.median(times[steps // 4 :]) * 1e3)
        del att, opt, model
        dist.barrier()
if rank == 0:
    for method, values in medians.items():
        print(
            f"{task_name} {method:11s} median ms per round: " + " ".join(f"{v:.2f}" for v in values)
        )
dist.destroy_process_group()
