"""Where does a Python comm hook's cost go on the digits CNN (unshaped, 2 gloo ranks)?"""
import os, sys, time, statistics
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from autocomp_bench.tasks import build_task
rank = int(os.environ["RANK"]); torch.set_num_threads(1)
task = build_task(sys.argv[1]); steps = int(sys.argv[2]); rounds = int(sys.argv[3])
dist.init_process_group("gloo")
W = dist.get_world_size()

def plain_then(state, bucket):
    buf = bucket.buffer().div_(W)
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])

def blocking(state, bucket):
    buf = bucket.buffer().div_(W)
    dist.all_reduce(buf)
    f = torch.futures.Future(); f.set_result(buf); return f

def noop(state, bucket):
    f = torch.futures.Future(); f.set_result(bucket.buffer()); return f

variants = {"builtin": None, "pt_hook": default_hooks.allreduce_hook, "then": plain_then, "blocking": blocking, "noop": noop}
models = {}
for k, h in variants.items():
    torch.manual_seed(0)
    m = DDP(task.build_model())
    if h is not None:
        m.register_comm_hook(None, h)
    models[k] = (m, task.make_optimizer(m.parameters()))
res = {k: [] for k in variants}
for r in range(rounds):
    order = list(variants) if r % 2 == 0 else list(reversed(variants))
    for k in order:
        m, opt = models[k]
        ts = []
        for s in range(steps):
            x, y = task.batch(rank, s, 0)
            t = time.perf_counter()
            loss = task.loss(m(x), y); opt.zero_grad(); loss.backward(); opt.step()
            ts.append(time.perf_counter() - t)
        res[k].append(statistics.median(ts[5:]) * 1e3)
if rank == 0:
    for k, v in res.items():
        ratios = [a / b for a, b in zip(v, res["builtin"])]
        print(f"{k:10s} median step ms {statistics.median(v):.3f}  ratio vs builtin per round {' '.join(f'{x:.3f}' for x in ratios)}  median {statistics.median(ratios):.3f}")
dist.destroy_process_group()
