"""Interleave modes step by step in one process pair: paired step times, main-thread CPU per step."""
import datetime, json, sys, tempfile, time, statistics, os, resource
from pathlib import Path
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
from autocomp_bench.tasks import build_task

def build(mode, task, kw):
    torch.manual_seed(0)
    spec = build_task(task)
    model = spec.build_model()
    ddp = DDP(model)
    ctl = None
    if mode == "free":
        ctl = autocomp.wrap(ddp, target_overlap=0.9, **kw)
    elif mode == "pinned":
        ctl = autocomp.wrap(ddp, target_overlap=0.9, plan={"*": "none"}, **kw)
    elif mode == "static4":
        ctl = autocomp.wrap(ddp, plan={"*": "powersgd:rank=4"})
    elif mode == "pinned4":
        ctl = autocomp.wrap(ddp, target_overlap=0.9, plan={"*": "powersgd:rank=4"}, **kw)
    elif mode == "static":
        ctl = autocomp.wrap(ddp, plan={"*": "none"})
    elif mode == "torch_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = spec.make_optimizer(ddp.parameters())
    return spec, ddp, ctl, opt

def main(rank, world, store, out, modes, steps, task, kw):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    built = {m: build(m, task, kw) for m in modes}
    times = {m: [] for m in modes}; cpu = {m: [] for m in modes}; flt = {m: [] for m in modes}; sys_ = {m: [] for m in modes}
    losses = {}
    seq = os.environ.get("SEQ")
    if seq:
        blocks = int(seq)
        sched = []
        for b in range(blocks):
            for m in (modes if b % 2 == 0 else modes[::-1]):
                sched += [(b * (steps // blocks) + i, m) for i in range(steps // blocks)]
    else:
        sched = [(step, m) for step in range(steps) for m in (modes if step % 2 == 0 else modes[::-1])]
    for step, m in sched:
        if True:
            r0 = resource.getrusage(resource.RUSAGE_THREAD)
            spec, ddp, ctl, opt = built[m]
            x, y = spec.batch(rank, step, 1)
            c0 = time.thread_time(); t0 = time.perf_counter()
            loss = spec.loss(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            v = float(loss.item()); losses.setdefault(m, []).append(v)
            if ctl is not None and ctl.adaptive is not None: ctl.observe_loss(v)
            times[m].append(time.perf_counter() - t0); cpu[m].append(time.thread_time() - c0)
            r1 = resource.getrusage(resource.RUSAGE_THREAD); flt[m].append(r1.ru_minflt - r0.ru_minflt); sys_[m].append(r1.ru_stime - r0.ru_stime)
    info = {}
    for m in modes:
        ctl = built[m][2]
        if ctl is not None:
            if ctl.adaptive is not None:
                info[m] = {"boundary": ctl.adaptive.boundary_seconds, "opening": ctl.adaptive.opening_seconds, "plan": sorted(set(ctl.plan.values())), "decisions": len(ctl.history)}
            ctl.close()
    if rank == 0: Path(out).write_text(json.dumps({"times": times, "cpu": cpu, "flt": flt, "sys": sys_, "losses": losses, "info": info}))
    dist.destroy_process_group()

if __name__ == "__main__":
    modes = sys.argv[1].split(","); steps = int(sys.argv[2]); task = sys.argv[3]
    kw = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "o.json")
        mp.start_processes(main, args=(2, str(Path(tmp)/"store"), out, modes, steps, task, kw), nprocs=2, start_method="spawn")
        res = json.loads(Path(out).read_text())
    Path(f"/tmp/s49/inter_{task}.json").write_text(json.dumps(res))
    base = modes[0]
    for m in modes:
        t = res["times"][m][5:]; c = res["cpu"][m][5:]
        rel = [a / b for a, b in zip(res["times"][m][5:], res["times"][base][5:])]
        print(f"{m:10s} median {statistics.median(t)*1000:.1f} ms  cpu {statistics.median(c)*1000:.1f} ms  paired ratio vs {base} {statistics.median(rel):.3f} minflt/step {statistics.fmean(res['flt'][m][5:]):.0f} sys ms/step {1000*statistics.fmean(res['sys'][m][5:]):.1f}", res["info"].get(m))
