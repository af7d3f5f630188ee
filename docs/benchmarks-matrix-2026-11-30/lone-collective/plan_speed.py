"""Median step of static autocomp plans on a tbf-shaped link, interleaved round by round.

2 gloo ranks in 2 network namespaces (autocomp_bench.shaped_link.ShapedLink). Every round
runs each plan for STEPS steps on a fresh model (same seed), the plans' order rotated per
round; the median of each run's steps after the first 20 is kept.
    python plan_speed.py TASK RATE_MBIT ROUNDS STEPS PLANS_JSON
"""
import datetime, json, os, statistics, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(task, rounds, steps, plans):
    import autocomp
    from autocomp_bench.tasks import build_task
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    spec = build_task(task)
    names = list(plans)
    out = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            torch.manual_seed(0)
            ddp = DDP(spec.build_model())
            ctl = autocomp.wrap(ddp, plan=plans[name], warmup_steps=2)
            opt = spec.make_optimizer(ddp.parameters())
            times = []
            for step in range(steps):
                x, y = spec.batch(rank, step, 0)
                t = time.perf_counter()
                loss = spec.loss(ddp(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
                times.append(time.perf_counter() - t)
            ctl.close()
            dist.barrier()
            out[name].append(statistics.median(times[20:]))
            if rank == 0:
                print(f"round {r} {name}: {out[name][-1]*1e3:.2f} ms", flush=True)
    if rank == 0:
        base = names[0]
        for n in names:
            ratios = [a / b for a, b in zip(out[n], out[base])]
            print(f"{n}: median {statistics.median(out[n])*1e3:.2f} ms; per round vs {base}: "
                  + " ".join(f"{x:.3f}" for x in ratios) + f"; median ratio {statistics.median(ratios):.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    if os.environ.get("PLAN_SPEED_WORKER"):
        worker(sys.argv[1], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5]))
        sys.exit(0)
    from autocomp_bench.shaped_link import ShapedLink
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=float(sys.argv[2]))) as link:
        procs = [link.popen(h, [sys.executable, *sys.argv],
                            env={**link.rank_env(h, world_size=2, master_port=29533), "PLAN_SPEED_WORKER": "1"})
                 for h in range(2)]
        rc = [p.wait(timeout=900) for p in procs]
        print("exit codes", rc)
