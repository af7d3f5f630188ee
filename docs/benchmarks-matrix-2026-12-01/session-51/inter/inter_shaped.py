"""Interleave modes step by step in one process pair over a shaped veth link (ShapedLink):
paired step times per mode, so the machine's drift falls on every mode alike.
  python inter_shaped.py MODES STEPS TASK RATE_MBIT OUT.json
MODES from: ddp, fp16_hook, static_none, static_f16, free (autocomp.wrap(ddp, target_overlap=0.9))."""
import datetime, json, os, statistics, sys, time
from pathlib import Path


def build(mode, task):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    import autocomp
    from autocomp_bench.tasks import build_task
    torch.manual_seed(0)
    spec = build_task(task)
    model = spec.build_model()
    ddp = DDP(model)
    ctl = None
    if mode == "free":
        ctl = autocomp.wrap(ddp, target_overlap=0.9)
    elif mode == "static_none":
        ctl = autocomp.wrap(ddp, plan={"*": "none"})
    elif mode == "static_f16":
        ctl = autocomp.wrap(ddp, plan={"*": "fp16:ef=false"})
    elif mode == "fp16_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif mode != "ddp":
        raise ValueError(mode)
    return spec, ddp, ctl, spec.make_optimizer(ddp.parameters())


def worker(modes, steps, task, out):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    built = {m: build(m, task) for m in modes}
    times = {m: [] for m in modes}
    # BLOCK=n (added in session 53): each mode runs n steps in a row, the order alternating
    # per block, so that an adaptive mode times its own steps; 1 (the default) interleaves the
    # modes step by step, as before.
    block = int(os.environ.get("BLOCK", "1"))
    for first in range(0, steps, block):
        for m in (modes if first // block % 2 == 0 else modes[::-1]):
            spec, ddp, ctl, opt = built[m]
            for step in range(first, min(first + block, steps)):
                x, y = spec.batch(rank, step, 1)
                t0 = time.perf_counter()
                loss = spec.loss(ddp(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                v = float(loss.item())
                if ctl is not None and ctl.adaptive is not None:
                    ctl.observe_loss(v)
                times[m].append(time.perf_counter() - t0)
    info = {}
    for m in modes:
        ctl = built[m][2]
        if ctl is not None and ctl.adaptive is not None:
            a = ctl.adaptive
            info[m] = {"boundary": a.boundary_seconds, "opening": a.opening_seconds,
                       "plan": sorted(set(ctl.plan.values())), "decisions": len(ctl.history),
                       "trail": [(r.step, (r.decision or {}).get("solver"), r.step_seconds) for r in ctl.history]}
        if ctl is not None:
            ctl.close()
    if rank == 0:
        Path(out).write_text(json.dumps({"times": times, "info": info}))
    dist.destroy_process_group()


def main():
    modes, steps, task, rate, out = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3], (None if sys.argv[4] == "none" else float(sys.argv[4])), sys.argv[5]
    if os.environ.get("INTER_WORKER"):
        return worker(modes, steps, task, out)
    from autocomp_bench.shaped_link import ShapedLink
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=rate, subnet="10.77.51.0/24")) as link:
        procs = [link.popen(h, [sys.executable, __file__, *sys.argv[1:]],
                            env={**link.rank_env(h, 2, 29611), "INTER_WORKER": "1", "GROUP_RANK": str(h)}) for h in range(2)]
        rcs = [p.wait(timeout=1800) for p in procs]
    assert rcs == [0, 0], rcs
    res = json.loads(Path(out).read_text())
    base = modes[0]
    for m in modes:
        skip = int(os.environ.get("SKIP", "10"))  # first steps left out (SKIP: session 53)
        t = res["times"][m][skip:]
        rel = [a / b for a, b in zip(t, res["times"][base][skip:])]
        total = sum(res["times"][m])
        print(f"{m:12s} median {statistics.median(t)*1000:6.1f} ms  mean {statistics.fmean(t)*1000:6.1f} ms  total {total:6.1f} s  paired median ratio vs {base} {statistics.median(rel):.3f}",
              {k: v for k, v in res["info"].get(m, {}).items() if k != "trail"})


if __name__ == "__main__":
    main()
