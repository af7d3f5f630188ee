"""Step time of PowerSGD r4 plans, side by side in one process pair (unshaped loopback)."""
import statistics, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, ".")
from autocomp_bench.tasks import build_task
from autocomp_bench.worker import attach
task_name, methods, steps, rounds = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
task = build_task(task_name)
medians = {m: [] for m in methods}
for _ in range(rounds):
    for method in methods:
        torch.manual_seed(0)
        model = task.build_model()
        if method == "psgd4-all":
            att = attach("static", model, {"plan": {"*": "powersgd:rank=4"}, "plan_warmup_steps": 2})
        elif method == "psgd4-2d":
            plan = [(n, "none") for n, p in model.named_parameters() if p.dim() < 2] + [("*", "powersgd:rank=4")]
            att = attach("static", model, {"plan": plan, "plan_warmup_steps": 2})
        else:
            att = attach(method, model, {})
        opt = task.make_optimizer(att.ddp.parameters())
        times = []
        for step in range(steps):
            x, y = task.batch(rank, step, 0)
            s = time.perf_counter()
            loss = task.loss(att.ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
            times.append(time.perf_counter() - s)
        if att.ctl is not None:
            att.ctl.close()
        medians[method].append(statistics.median(times[steps // 4:]) * 1e3)
        del att, opt, model
        dist.barrier()
if rank == 0:
    for m, v in medians.items():
        print(f"{task_name} {m:12s} " + " ".join(f"{x:.2f}" for x in v))
dist.destroy_process_group()
