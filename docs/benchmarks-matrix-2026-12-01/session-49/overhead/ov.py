"""gpt unshaped: ddp vs adaptive (tta defaults) vs adaptive pinned none, interleaved, per-step times."""
import datetime, json, sys, tempfile, time, statistics, cProfile, pstats, io
from pathlib import Path
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
from autocomp_bench.tasks import build_task

import os
def threads_cpu():
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            st = open(f"/proc/self/task/{tid}/stat").read()
            name = open(f"/proc/self/task/{tid}/comm").read().strip()
        except OSError:
            continue
        f = st.rsplit(")", 1)[1].split()
        out[f"{tid}:{name}"] = (int(f[11]) + int(f[12])) / tick
    return out

def run(mode, rank, steps, prof=False):
    torch.manual_seed(0)
    spec = build_task(__import__("os").environ.get("TASK", "gpt"))
    model = spec.build_model()
    ddp = DDP(model)
    ctl = None
    if mode == "free":
        ctl = autocomp.wrap(ddp, target_overlap=0.9)
    elif mode == "pinned":
        ctl = autocomp.wrap(ddp, target_overlap=0.9, plan={"*": "none"})
    elif mode == "static":
        ctl = autocomp.wrap(ddp, plan={"*": "none"})
    opt = spec.make_optimizer(ddp.parameters())
    times = []
    th0 = threads_cpu()
    pr = cProfile.Profile() if prof and rank == 0 else None
    for step in range(steps):
        x, y = spec.batch(rank, step, 1)
        if pr and step == 20: pr.enable()
        t0 = time.perf_counter()
        loss = spec.loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        v = float(loss.item())
        if ctl is not None and mode != "static": ctl.observe_loss(v)
        e = torch.tensor([time.perf_counter()], dtype=torch.float64)
        dist.all_reduce(e, op=dist.ReduceOp.MAX)
        times.append(time.perf_counter() - t0)
    extra = {"threads": {k: round(v - th0.get(k, 0.0), 3) for k, v in threads_cpu().items()}, "pynames": [t.name for t in __import__("threading").enumerate()]}
    if pr:
        pr.disable()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats("autocomp/", 60); extra["prof"] = s.getvalue(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_callees("autocomp_hook"); extra["callees"] = s.getvalue()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); extra["proft"] = s.getvalue()
    if ctl is not None:
        if ctl.adaptive is not None:
            extra["boundary"] = ctl.adaptive.boundary_seconds; extra["opening"] = ctl.adaptive.opening_seconds
            extra["plan"] = sorted(set(ctl.plan.values()))
        ctl.close()
    return times, extra

def main(rank, world, store, out, modes, rounds, steps, prof):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    res = []
    for r in range(rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            t, extra = run(m, rank, steps, prof)
            res.append({"round": r, "mode": m, "times": t, **extra})
    if rank == 0: Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()

if __name__ == "__main__":
    modes = sys.argv[1].split(","); rounds = int(sys.argv[2]); steps = int(sys.argv[3]); prof = len(sys.argv) > 4
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "o.json")
        mp.start_processes(main, args=(2, str(Path(tmp)/"store"), out, modes, rounds, steps, prof), nprocs=2, start_method="spawn")
        res = json.loads(Path(out).read_text())
    Path("/tmp/s49/ov_last.json").write_text(json.dumps(res))
    for e in res:
        t = e["times"][2:]
        print(e.get("threads"), e.get("pynames")); print(e["round"], e["mode"], "median %.4f mean %.4f" % (statistics.median(t), statistics.fmean(t)), "boundary", round(e.get("boundary", 0), 3), "opening", round(e.get("opening", 0), 3), e.get("plan"))
    for m in modes:
        print(m, "median of medians %.4f" % statistics.median([statistics.median(e["times"][2:]) for e in res if e["mode"] == m]))
