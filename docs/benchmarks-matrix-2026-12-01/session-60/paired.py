"""Step time of several comm methods on one shaped link, alternated step by step (scratch; session 55: paired_steps.py of docs/benchmarks-static-2026-11-29 with the buy, pos8, pos16, inp16, e16i16 and psgd4b plans added, and no gpt-deep import).

The machine's speed drifts by 10-30% within an hour (the hook's median step ran 0.33-0.46 s
on one model over 90 minutes, 2026-11-29), more than the step differences between plans, so
separate 60 s runs cannot rank plans by step time. Here every rank builds one model per
method from the same seed, each under its own DDP and comm hook, and steps them in turn
(A, B, C, A, B, C, ...) on the same 2-rank link. Drift then falls on all methods alike, and
per method the median of its own steps (forward, backward, optimizer; a barrier before each)
is comparable with the others'.

Run from the repository root, as root (needs iproute2):
    PYTHONPATH=docs/benchmarks-heldout-gpt12-2026-11-26 .venv/bin/python \
        docs/benchmarks-static-2026-11-29/paired_steps.py --rate 50 --steps 60 --out OUT.json
``--profile N`` then takes N more steps of every method, in turn, under one torch.profiler
on rank 0 and records each operator's self CPU time per method and step.
"""

import argparse
from contextlib import nullcontext
import json
import os
import statistics
import sys
import time

PLANS = {
    "nonep": {"*": "none"},
    "fp16s": {"*": "fp16:ef=false"},
    "conv4": {"*conv*": "powersgd:rank=4,ef=true", "*": "none"},
    "step2": {"*conv*": "powersgd:rank=4,ef=true", "head.weight": "fp16:ef=false", "*": "none"},
    "conv4f": {"*conv*": "powersgd:rank=4,ef=true", "*": "fp16:ef=false"},
    "psgd4": {"*": "powersgd:rank=4"},
    "s8plan": {
        "embed.weight": "int8:chunk=256,ef=true",
        "blocks.0.attn.out_proj.weight": "int8:chunk=256,ef=true",
        "position": "fp16:ef=false",
        "*": "powersgd:rank=4",
    },
    # s8plan's three departures from rank 4, one at a time
    "emb8": {"embed.weight": "int8:chunk=256,ef=true", "*": "powersgd:rank=4"},
    "out8": {"blocks.0.attn.out_proj.weight": "int8:chunk=256,ef=true", "*": "powersgd:rank=4"},
    "pos16": {"position": "fp16:ef=false", "*": "powersgd:rank=4"},
    # rank 4 on the matrices only: the 1-D tensors (biases, norms) on the plain all-reduce
    "psgd4-2d": {"*bias": "none", "*norm*": "none", "*": "powersgd:rank=4"},
    # the plan the averaged-error engine ran on seed 0 (thirty-first session), and its
    # embedding's rank 16 alone
    "avg0": {
        "position": "int8:chunk=256,ef=true",
        "embed.weight": "powersgd:rank=16",
        "blocks.0.attn.in_proj_weight": "powersgd:rank=16",
        "blocks.0.attn.out_proj.weight": "int8:chunk=256,ef=true",
        "*": "powersgd:rank=4",
    },
    "emb16": {"embed.weight": "powersgd:rank=16", "*": "powersgd:rank=4"},
    "buy": {
        "position": "int8:chunk=256,ef=true",
        "embed.weight": "powersgd:rank=16",
        "blocks.0.attn.in_proj_weight": "powersgd:rank=16",
        "*": "powersgd:rank=4",
    },
    "psgd4b": {"*": "powersgd:rank=4"},
    "pos16": {"position": "fp16:ef=false", "*": "powersgd:rank=4"},
    "pos8": {"position": "int8:chunk=256,ef=true", "*": "powersgd:rank=4"},
    "inp16": {"blocks.0.attn.in_proj_weight": "powersgd:rank=16", "*": "powersgd:rank=4"},
    "e16i16": {"embed.weight": "powersgd:rank=16", "blocks.0.attn.in_proj_weight": "powersgd:rank=16", "*": "powersgd:rank=4"},
}


def method_cfg(name: str) -> dict:
    if name in PLANS:
        return {"method": "static", "plan": PLANS[name], "plan_warmup_steps": 2}
    if name == "adaptive":
        return {"method": "adaptive", "adaptive_kwargs": {"target_overlap": 0.9}}
    if name.startswith("ad-") and name[3:] in PLANS:
        return {"method": "adaptive", "adaptive_kwargs": {"target_overlap": 0.9, "plan": PLANS[name[3:]]}}
    if name == "adaptive-pinned":
        return {"method": "adaptive", "adaptive_kwargs": {"target_overlap": 0.9, "plan": {"*": "fp16:ef=false"}}}
    return {"method": name}


def step_order(runs: list, step: int) -> list:
    """The order of the methods at ``step``: rotated by one every two steps, reversed on odd
    steps, so over 2n steps every method takes every position, and follows every other,
    equally often. (Until 2026-11-29 only the reversal: with three methods the middle one was
    always stepped between the other two, and measured 4-5 ms faster than an identical plan
    at the ends.)"""
    shift = (step // 2) % len(runs)
    rotated = runs[shift:] + runs[:shift]
    return rotated if step % 2 == 0 else rotated[::-1]


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from autocomp_bench.tasks import build_task
    from autocomp_bench.worker import attach

    task = build_task(args.task)
    methods = args.methods.split(",")
    runs = []
    for m in methods:
        torch.manual_seed(args.seed)
        model = task.build_model()
        cfg = method_cfg(m)
        attached = attach(cfg["method"], model, cfg)
        runs.append((m, attached, task.make_optimizer(attached.ddp.parameters())))
    times: dict[str, list[float]] = {m: [] for m in methods}
    losses: dict[str, float] = {}
    parts: dict[str, list[tuple[float, float, float]]] = {m: [] for m in methods}
    plans: dict[str, list] = {}
    for step in range(args.warm + args.steps):
        for m, attached, opt in step_order(runs, step):
            x, y = task.batch(rank, step, args.seed)
            dist.barrier()
            t0 = time.perf_counter()
            loss = task.loss(attached.ddp(x), y)
            opt.zero_grad(set_to_none=True)
            tf = time.perf_counter()
            loss.backward()
            tb = time.perf_counter()
            opt.step()
            t1 = time.perf_counter()
            if step >= args.warm:
                times[m].append(t1 - t0)
                parts[m].append((tf - t0, tb - tf, t1 - tb))
            losses[m] = float(loss.detach())
            if attached.ctl is not None and step % 25 == 0 and rank == 0:
                import collections
                plans.setdefault(m, []).append((step, dict(collections.Counter(attached.ctl.plan.values()))))
    profiles: dict[str, dict[str, list[float]]] = {}
    if args.profile:
        # Then --profile more steps of every method, still in turn, under one torch.profiler
        # on rank 0, each method's step inside a record_function label: per method and
        # operator, the CPU time of that operator's events below the label (self time), so
        # drift falls on every method alike here too.
        from torch.autograd.profiler import record_function
        from torch.profiler import ProfilerActivity, profile

        recorder = profile(activities=[ProfilerActivity.CPU]) if rank == 0 else nullcontext()
        with recorder as prof:
            for step in range(args.profile):
                for m, attached, opt in step_order(runs, step):
                    x, y = task.batch(rank, args.warm + args.steps + step, args.seed)
                    dist.barrier()
                    with record_function(f"method:{m}"):
                        loss = task.loss(attached.ddp(x), y)
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                        opt.step()
        if rank == 0:
            for event in prof.events():
                top = event
                while top.cpu_parent is not None:
                    top = top.cpu_parent
                if top is event or not top.name.startswith("method:"):
                    continue
                ops = profiles.setdefault(top.name[len("method:") :], {})
                entry = ops.setdefault(event.name, [0.0, 0])
                entry[0] += event.self_cpu_time_total / args.profile / 1e3
                entry[1] += 1
    for _, attached, _ in runs:
        if attached.ctl is not None:
            attached.ctl.close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "times": times,
                    "parts": parts,
                    "profiles": profiles,
                    "last_train_loss": losses,
                    "plans": plans,
                    "args": vars(args),
                },
                f,
            )
    dist.destroy_process_group()


def run_ranks_on_shaped_link(script: str, rate_mbit: float, port: int, timeout_s: float) -> None:
    """Run ``script`` with this command line plus ``--worker`` as 2 ranks, one per namespace
    of a 2-host ShapedLink at ``rate_mbit``; raise SystemExit if a rank fails. The
    namespaces are removed on exit (ShapedLink's context). Also used by tail_collectives.py."""
    from autocomp_bench.shaped_link import ShapedLink

    argv = [sys.executable, os.path.abspath(script), *sys.argv[1:], "--worker"]
    with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=rate_mbit)) as link:
        procs = [link.popen(h, argv, env=link.rank_env(h, 2, port)) for h in range(2)]
        codes = [proc.wait(timeout=timeout_s) for proc in procs]
    if any(codes):
        raise SystemExit(f"workers exited with {codes}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--methods", default="powersgd,psgd4,s8plan,limit")
    p.add_argument("--task", default="gpt-deep")
    p.add_argument("--rate", type=float, default=50.0, help="Mbit/s")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="/tmp/paired_steps.json")
    p.add_argument("--profile", type=int, default=0, help="then N steps per method profiled")
    p.add_argument("--worker", action="store_true")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    run_ranks_on_shaped_link(__file__, args.rate or None, port=29611, timeout_s=1800)  # 0: unshaped
    result = json.load(open(args.out))
    med = {m: statistics.median(v) for m, v in result["times"].items()}
    result["median_step_s"] = med
    json.dump(result, open(args.out, "w"), indent=1)
    base = med.get("powersgd")
    for m, v in med.items():
        fwd, bwd, opt = (statistics.median(p[i] for p in result["parts"][m]) for i in range(3))
        print(
            f"{m:10s} {v:.4f} s" + (f"  {v / base:.3f}x the hook" if base else "")
            + f"  (medians: forward {fwd * 1e3:.1f} ms, backward with the hook {bwd * 1e3:.1f} ms,"
            f" optimizer {opt * 1e3:.1f} ms)",
            flush=True,
        )


if __name__ == "__main__":
    main()
