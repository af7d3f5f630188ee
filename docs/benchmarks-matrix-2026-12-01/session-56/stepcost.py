"""Per-step wall time of adaptive on a shaped 2-rank link, each step tagged: boundary (with
or without a link probe), sampled (the steps before a boundary), other (scratch)."""
import argparse, functools, json, statistics, sys, time, os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session-55"))
from paired import run_ranks_on_shaped_link

def worker(args):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    import autocomp.adaptive as A
    marks = {}
    orig_b = A.AdaptiveLoop._boundary
    def boundary(self, step):
        t = time.perf_counter(); probe = self._probe_next
        try: return orig_b(self, step)
        finally: marks[step] = ("probe" if probe else "boundary", time.perf_counter() - t)
    A.AdaptiveLoop._boundary = boundary
    from autocomp_bench.tasks import build_task
    from autocomp_bench.worker import attach
    task = build_task(args.task)
    torch.manual_seed(1)
    att = attach("adaptive", task.build_model(), {"adaptive_kwargs": {"target_overlap": 0.9}})
    opt = task.make_optimizer(att.ddp.parameters())
    rank = dist.get_rank(); loop = att.ctl.adaptive
    rows = []
    for step in range(args.steps):
        x, y = task.batch(rank, step, 1)
        sampled = loop.next_boundary(step) - step <= loop.config.sampled_steps if step > 0 else False
        dist.barrier()
        t0 = time.perf_counter()
        loss = task.loss(att.ddp(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        plan_kinds = set(att.ctl.plan.values())
        rows.append((step, time.perf_counter() - t0, sampled, "fp16" if plan_kinds == {"fp16:ef=false"} else "mixed"))
    if rank == 0:
        tags = {}
        for step, s, sampled, plan in rows[5:]:
            kind = marks.get(step, (None,))[0] or ("sampled" if sampled else "other-" + plan)
            tags.setdefault(kind, []).append(s)
        base = statistics.median(tags.get("other-fp16") or tags["other-mixed"])
        print(f"{args.task} @ {args.rate}: {len(rows)} steps, median other {base*1e3:.2f} ms")
        for k, v in tags.items():
            print(f"  {k:9s} n={len(v):4d} median {statistics.median(v)*1e3:7.2f} ms  excess total {sum(x - base for x in v):.3f} s")
        inside = [d for k, d in marks.values() if k == "boundary"]
        print(f"  rank-0 _boundary (no probe) median {statistics.median(inside)*1e3:.2f} ms over {len(inside)}")
        json.dump({"rows": rows, "marks": marks}, open(args.out, "w"))
    att.ctl.close()
    dist.destroy_process_group()

p = argparse.ArgumentParser()
p.add_argument("--task", default="cnn"); p.add_argument("--rate", type=float, default=200)
p.add_argument("--steps", type=int, default=1200); p.add_argument("--out", default="/tmp/stepcost.json")
p.add_argument("--worker", action="store_true")
a = p.parse_args()
if a.worker: worker(a)
else: run_ranks_on_shaped_link(__file__, a.rate, port=29615, timeout_s=900)
