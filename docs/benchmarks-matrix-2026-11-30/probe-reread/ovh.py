"""(Scratch copy, forty-second session: MODES gains "free", autocomp.wrap(ddp, target_overlap=0.9)
unpinned; run as python ovh.py --task gpt --steps 60 --rounds 4; raw times to /tmp/s42/raw.json.)

What autocomp's machinery costs when it compresses nothing: hook and profiler overhead.

Two local gloo ranks (loopback) train a model four ways, with the same seed and batches,
interleaved round by round so machine load hits all alike. The model is the 16.5M-parameter
byte-level LM by default (``--task lm16m``), or one of the time-to-accuracy tasks
(``--task cnn``: a 7-10 ms step, where a fixed cost per step shows most):

- ``ddp``: plain DDP, PyTorch's built-in all-reduce;
- ``torch_hook``: DDP with PyTorch's own Python all-reduce hook (``default_hooks.allreduce_hook``):
  what any Python comm hook costs before it does anything (the call from the reducer, the
  collective's Python wrapper, the completion callback that hands DDP its tensor);
- ``static``: ``autocomp.wrap(ddp, plan={"*": "none"})``, the unified hook with no profiler;
- ``adaptive``: ``autocomp.wrap(ddp, target_overlap=0.9, plan={"*": "none"})``, everything
  pinned uncompressed, so the profiler, sampled norms and the per-window collectives and
  decision run while the bytes stay identical.

``adaptive / static`` is the profiling overhead (target <= 2% of step time); ``static / ddp``
is the cost of routing gradients through autocomp's hook at all, of which ``torch_hook / ddp``
is the Python hook mechanism's share and ``static / torch_hook`` autocomp's own. All are
reported per round (each round's median step of each mode) and as the median over rounds, so
one noisy round shows as spread instead of moving the result. Independently of that A/B
comparison, the adaptive loop accounts its own window-boundary time
(``AdaptiveLoop.boundary_seconds``), reported per step as a share of the step: the part of the
overhead that does not hide in the noise of the hook's per-bucket timestamps.

    python -m autocomp_bench.overhead --steps 40 --rounds 5
    python -m autocomp_bench.overhead --task cnn --steps 300 --rounds 8
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from autocomp_bench.workloads import MLPLanguageModel, text_batch, text_split

logger = logging.getLogger(__name__)

MODES = ("ddp", "static", "adaptive", "free")


DEFAULT_TASK = "lm16m"
"""The 16.5M-parameter byte-level LM, SGD at 1e-3 (the benchmark's original model)."""


def _workload(task: str) -> tuple[Any, Any, Any, Any]:
    """(model, optimizer factory, batch(rank, step), loss(output, target)) of ``task``."""
    if task == DEFAULT_TASK:
        model = MLPLanguageModel(hidden=3072)
        split = text_split()
        return (
            model,
            lambda params: torch.optim.SGD(params, lr=1e-3),
            lambda rank, step: text_batch(split.train, model.context, 64, rank, step),
            F.cross_entropy,
        )
    from autocomp_bench.tasks import build_task

    spec = build_task(task)
    return (
        spec.build_model(),
        spec.make_optimizer,
        lambda rank, step: spec.batch(rank, step, 0),
        spec.loss,
    )


def _run_mode(
    mode: str, rank: int, steps: int, window: int, task: str
) -> tuple[list[float], float, float]:
    """Step times after the first two, the adaptive loop's boundary and opening seconds."""
    torch.manual_seed(0)
    model, make_optimizer, batch, loss_fn = _workload(task)
    ddp = DDP(model)
    ctl = None
    if mode == "torch_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif mode == "static":
        ctl = autocomp.wrap(ddp, plan={"*": "none"})
    elif mode == "free":
        ctl = autocomp.wrap(ddp, target_overlap=0.9)
    elif mode == "adaptive":
        ctl = autocomp.wrap(
            ddp, plan={"*": "none"}, target_overlap=0.9, window=window, warmup_steps=0
        )
    opt = make_optimizer(ddp.parameters())
    times = []
    for step in range(steps):
        x, y = batch(rank, step)
        start = time.perf_counter()
        loss = loss_fn(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    boundary = opening = 0.0
    if ctl is not None:
        if ctl.adaptive is not None:
            boundary = ctl.adaptive.boundary_seconds
            opening = ctl.adaptive.opening_seconds
        ctl.close()
    # The first steps include DDP's bucket rebuild and lazy initialization.
    return times[2:], boundary, opening


def _rank_main(
    rank: int, world: int, store: str, steps: int, window: int, rounds: int, out: str, task: str
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, world),
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    try:
        rounds_out: list[dict[str, Any]] = []
        for _ in range(rounds):
            entry: dict[str, Any] = {"times": {}, "boundary_s": 0.0, "opening_s": 0.0}
            for mode in MODES:
                times, boundary, opening = _run_mode(mode, rank, steps, window, task)
                entry["times"][mode] = times
                entry["boundary_s"] += boundary
                entry["opening_s"] += opening
            rounds_out.append(entry)
        if rank == 0:
            Path(out).write_text(json.dumps(rounds_out))
    finally:
        dist.destroy_process_group()


def summarize(rounds: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Per-round medians and ratios, their median over rounds, and the boundary share."""
    per_round = []
    for entry in rounds:
        medians = {mode: statistics.median(entry["times"][mode]) for mode in MODES}
        per_round.append(
            {
                "median_step_s": medians,
                "hook_overhead": medians["static"] / medians["ddp"] - 1.0,
                "python_hook_overhead": medians["free"] / medians["ddp"] - 1.0,
                "own_hook_overhead": medians["free"] / medians["adaptive"] - 1.0,
                "profiling_overhead": medians["adaptive"] / medians["static"] - 1.0,
                # Boundaries over all steps of the run (the untimed first two included).
                "boundary_share": entry["boundary_s"] / steps / medians["adaptive"],
                "opening_s": entry.get("opening_s", 0.0),
            }
        )

    def over_rounds(key: str) -> dict[str, float]:
        values = [r[key] for r in per_round]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    all_times = {mode: [t for e in rounds for t in e["times"][mode]] for mode in MODES}
    return {
        "rounds": per_round,
        "median_step_s": {mode: statistics.median(v) for mode, v in all_times.items()},
        "steps_per_mode": {mode: len(v) for mode, v in all_times.items()},
        "hook_overhead": over_rounds("hook_overhead"),
        "python_hook_overhead": over_rounds("python_hook_overhead"),
        "own_hook_overhead": over_rounds("own_hook_overhead"),
        "profiling_overhead": over_rounds("profiling_overhead"),
        "boundary_share": over_rounds("boundary_share"),
        "opening_s": over_rounds("opening_s"),
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per mode and round")
    parser.add_argument("--window", type=int, default=20, help="adaptive window")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument(
        "--task",
        default=DEFAULT_TASK,
        help=f"{DEFAULT_TASK} (default) or a task of autocomp_bench.tasks (cnn, gpt, lstm-lm, ...)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args(argv)
    if args.steps < 5 or args.rounds < 1 or args.window < 1:
        parser.error("need --steps >= 5, --rounds >= 1, --window >= 1")
    if args.task != DEFAULT_TASK:
        from autocomp_bench.tasks import TASKS

        if args.task not in TASKS:
            parser.error(f"unknown --task {args.task!r}; one of {DEFAULT_TASK}, {', '.join(TASKS)}")
    with tempfile.TemporaryDirectory(prefix="autocomp-overhead-") as tmp:
        out = Path(tmp) / "times.json"
        mp.start_processes(
            _rank_main,
            args=(
                2,
                str(Path(tmp) / "store"),
                args.steps,
                args.window,
                args.rounds,
                str(out),
                args.task,
            ),
            nprocs=2,
            start_method="spawn",
        )
        Path('/tmp/s42/raw.json').write_text(out.read_text())
        result = summarize(json.loads(out.read_text()), args.steps)
    result["task"] = args.task

    def spread(key: str) -> str:
        r = result[key]
        return f"{r['median']:+.1%} (rounds {r['min']:+.1%} .. {r['max']:+.1%})"

    model = "16.5M-parameter LM" if args.task == DEFAULT_TASK else f"task {args.task}"
    print(f"autocomp overhead on loopback, 2 gloo ranks, {model}, nothing compressed")
    for mode in MODES:
        print(
            f"  {mode:<10} median {result['median_step_s'][mode] * 1e3:8.1f} ms/step "
            f"({result['steps_per_mode'][mode]} steps)"
        )
    for i, r in enumerate(result["rounds"]):
        m = r["median_step_s"]
        print(
            f"  round {i}: ddp {m['ddp'] * 1e3:.1f}, free {m['free'] * 1e3:.1f}, "
            f"static {m['static'] * 1e3:.1f}, adaptive {m['adaptive'] * 1e3:.1f} ms; "
            f"adaptive/static {r['profiling_overhead']:+.1%}"
        )
    print(f"  autocomp's hook vs built-in all-reduce: {spread('hook_overhead')}")
    print(f"    PyTorch's Python all-reduce hook vs built-in: {spread('python_hook_overhead')}")
    print(f"    autocomp's hook vs PyTorch's Python hook: {spread('own_hook_overhead')}")
    print(f"  profiler + window loop vs hook (target <= 2%): {spread('profiling_overhead')}")
    print(
        f"  window boundaries, accounted by the loop itself: "
        f"{result['boundary_share']['median']:.2%} of the step"
    )
    print(
        "  the opening (link probe and decision, once at step 0): "
        f"{result['opening_s']['median'] * 1e3:.0f} ms"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
