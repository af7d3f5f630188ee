import statistics, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, ".")
from autocomp_bench.tasks import build_task
from autocomp_bench.worker import attach
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
import autocomp.hook as H
task_name, methods, steps, rounds = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
task = build_task(task_name)
W = dist.get_world_size()
def minimal(state, bucket):
    buf = bucket.buffer(); buf.mul_(1.0 / W)
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])
def minimal_nomul(state, bucket):
    buf = bucket.buffer()
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])
orig_avg = H.average_in_place
medians = {m: [] for m in methods}
for _ in range(rounds):
    for method in methods:
        torch.manual_seed(0)
        model = task.build_model()
        H.average_in_place = (lambda b, w: None) if method == "static-nomul" else orig_avg
        if method.startswith("fused:"):  # fused:FILE.json, the prototype's whole-bucket cast
            import json, importlib
            sys.path.insert(0, __import__("os").path.dirname(__file__)); import fusedproto; fusedproto.install()
            att = attach("static", model, {"plan": json.load(open(method.removeprefix("fused:"))), "seed": 0})
            import autocomp.hook as HH, autocomp.attach as AA
            HH.autocomp_hook = fusedproto._orig; AA.autocomp_hook = fusedproto._orig
        elif method.startswith("plan:"):  # plan:FILE.json, a whole static plan
            import json
            att = attach("static", model, {"plan": json.load(open(method.removeprefix("plan:"))), "seed": 0})
        elif method.startswith("static:"):  # static:NAME=SPEC, one parameter's compressor
            name, spec = method.removeprefix("static:").split("=", 1)
            att = attach("static", model, {"plan": {name: spec}, "seed": 0})
        elif method in ("static-none", "static-nomul"):
            att = attach("static", model, {"plan": {"*": "none"}, "seed": 0})
        elif method in ("minimal", "minimal_nomul", "pt_allreduce"):
            att = attach("allreduce", model, {})
            hook = {"minimal": minimal, "minimal_nomul": minimal_nomul, "pt_allreduce": default_hooks.allreduce_hook}[method]
            att.ddp.register_comm_hook(None, hook)
        else:
            att = attach(method, model, {"adaptive_kwargs": {"target_overlap": 0.9}, "seed": 0})
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
        print(f"{task_name} {m:14s} " + " ".join(f"{x:.2f}" for x in v))
dist.destroy_process_group()
