"""One rank of a benchmark run: read the run's config, train, write ``result-rank{RANK}.json``.

:class:`~autocomp_bench.harness.Runner` starts two of these (``python -m
autocomp_bench.worker CONFIG``), one per host of the network, with the torch.distributed
environment set. Every method trains a fresh model of one task
(:mod:`autocomp_bench.tasks`) from the same seed; :func:`attach` puts the method's
communication on the DDP model. Two loops:

* ``steps`` (:func:`train_steps`, ``autocomp-bench link``, ``advisor``, ``make demo``): a
  fixed number of steps, each timed on its own;
* ``budget`` (:func:`train_budget`, ``autocomp-bench tta``): as many steps as fit in a
  wall-clock budget, with the validation metric at evenly spaced points of it.
"""

from __future__ import annotations

import datetime
import gc
import itertools
import json
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "attach",
    "check_same_init",
    "main",
    "powersgd_wire_bytes",
    "send_nothing",
    "worker_main",
    "worker_paths",
]

DEFAULT_TASK = "mlp-lm-large"
"""The task of configs that name none: the link benchmark's LM."""
POWERSGD_RANK = 4
POWERSGD_START_ITER = 2
"""PyTorch requires start_powerSGD_iter >= 2 when error feedback or warm start is on."""
POWERSGD_MIN_COMPRESSION_RATE = 2
POWERSGD_BUCKET_CAP_MB = 1000
"""One bucket: with several, PyTorch's powerSGD_hook aborts on gloo (see the link
benchmark's ``POWERSGD_NOTE``)."""
TARGET_OVERLAP = 0.9
DROP_SYNC_TIMEOUT_S = 300.0
FINAL_LOSS_STEPS = 5


# ---- methods ---------------------------------------------------------------------------------


def powersgd_wire_bytes(shapes: Sequence[Sequence[int]], rank: int, min_rate: float) -> int:
    """Bytes one rank sends per compressed step under PyTorch's powerSGD_hook.

    Mirrors ``powerSGD_hook._should_compress``: a gradient viewed as (shape[0], rest) is
    compressed when (n + m) * r * min_rate < n * m, with r = min(n, m, rank); it then sends
    P (n x r) and Q (m x r) in float32. Everything else is all-reduced uncompressed.
    """
    total = 0
    for shape in shapes:
        numel = math.prod(shape)
        n = shape[0] if shape else 1
        m = numel // n if n else 0
        r = min(n, m, rank)
        if (n + m) * r * min_rate < n * m:
            total += (n + m) * r * 4
        else:
            total += numel * 4
    return total


def send_nothing(_state, bucket):  # type: ignore[no-untyped-def]
    """A comm hook that communicates nothing: each rank keeps its own gradient.

    Training with it costs only compute, the limit every compressor approaches.
    """
    # No annotations: DDP checks them and rejects the strings ``from __future__`` makes.
    import torch

    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


@dataclass(slots=True)
class Attached:
    """A model under DDP with one method's communication."""

    ddp: Any
    ctl: Any
    """autocomp's controller, for the autocomp methods (else None)."""
    bytes_per_step: float | None
    """Bytes a rank sends per step once the method compresses (None: the controller counts)."""


def attach(method: str, model: Any, cfg: dict[str, Any]) -> Attached:
    """Wrap ``model`` in DDP and set up ``method`` (see the benchmarks for each one's meaning).

    DDP runs with ``init_sync=False``: its usual start-up broadcast of all parameters would
    take a minute per run at 10 Mbit/s and measure nothing; :func:`check_same_init` checks
    instead that every rank built the same parameters.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    import autocomp

    numel = sum(p.numel() for p in model.parameters())
    if method == "allreduce":
        return Attached(DDP(model, init_sync=False), None, 4.0 * numel)
    if method == "fp16":
        ddp = DDP(model, init_sync=False)
        ddp.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
        return Attached(ddp, None, 2.0 * numel)
    if method == "powersgd":
        ddp = DDP(model, bucket_cap_mb=POWERSGD_BUCKET_CAP_MB, init_sync=False)
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=POWERSGD_RANK,
            start_powerSGD_iter=POWERSGD_START_ITER,
            min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE,
            use_error_feedback=True,
            warm_start=True,
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        shapes = [list(p.shape) for p in model.parameters()]
        wire = powersgd_wire_bytes(shapes, POWERSGD_RANK, POWERSGD_MIN_COMPRESSION_RATE)
        return Attached(ddp, None, float(wire))
    if method == "limit":
        ddp = DDP(model, init_sync=False)
        ddp.register_comm_hook(state=None, hook=send_nothing)
        return Attached(ddp, None, 0.0)
    if method == "autocomp":
        # The link benchmark's controller: target_overlap 0.9, its own window and warm-up
        # (None: the policy preset's).
        ddp = DDP(model, init_sync=False)
        ctl = autocomp.wrap(
            ddp,
            target_overlap=TARGET_OVERLAP,
            window=cfg["window"],
            warmup_steps=cfg.get("autocomp_warmup_steps", 0),
            run_dir=Path(cfg.get("autocomp_run_dir") or Path(cfg["run_dir"]) / "autocomp-run"),
        )
        return Attached(ddp, ctl, None)
    if method == "adaptive":
        # The time-to-accuracy benchmark's controller: exactly the user's call.
        ddp = DDP(model, init_sync=False)
        return Attached(ddp, autocomp.wrap(ddp, **cfg["adaptive_kwargs"]), None)
    if method == "static":
        # A fixed per-layer plan (the advisor's plans, the tta oracle's grid).
        ddp = DDP(model, init_sync=False)
        warmup = cfg.get("plan_warmup_steps")
        kwargs = {} if warmup is None else {"warmup_steps": warmup}
        return Attached(ddp, autocomp.wrap(ddp, plan=cfg["plan"], **kwargs), None)
    raise ValueError(f"unknown method {method!r}")


def check_same_init(model: Any) -> None:
    """Raise unless every rank built the same parameters (seeded init)."""
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64).remainder_(997)
        checksum = torch.stack([flat.sum(), (flat * weights).sum()])
    low, high = checksum.clone(), checksum.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if not torch.equal(low, high):
        raise RuntimeError("ranks built different initial parameters; the seeds differ")


def _build(cfg: dict[str, Any]) -> tuple[Any, Any, Attached, Any]:
    """(task, model, attached method, optimizer) of a run, the model seeded alike on all ranks."""
    import torch

    from autocomp_bench.tasks import build_task

    torch.manual_seed(cfg["seed"])
    task = build_task(cfg.get("task") or DEFAULT_TASK)
    model = task.build_model()
    check_same_init(model)
    attached = attach(cfg["method"], model, cfg)
    return task, model, attached, task.make_optimizer(attached.ddp.parameters())


TRAIL_REASON_CHARS = 200
"""Reasons in a decision trail are cut to this many characters."""


def decision_trail(history: list[Any]) -> list[dict[str, Any]]:
    """Rank 0's decisions in brief, for the JSON: when a cell lands on a different plan from
    one run to the next, the trail says which look or window took which turn and why (the
    step, the solver, predicted, compute-only and measured steps, what the window before it
    measured (its compute-only step, backward and hideable backward, link busy time,
    compression work, exposed time and bytes sent per step, so a predicted step can be taken
    apart against the measured one), and per optimizer layer its option, predicted seconds
    and reason)."""
    trail = []
    for record in history:
        decision = record.decision
        if not decision:
            continue
        layers = {
            layer["name"]: [
                layer["spec"],
                round(float(layer["predicted_seconds"]), 6),
                str(layer["reason"])[:TRAIL_REASON_CHARS],
            ]
            for layer in decision.get("layers", [])
            if layer.get("rule") not in ("too_small", "1d", "pin")
        }
        trail.append(
            {
                "step": record.step,
                "solver": decision.get("solver"),
                "predicted_step_s": decision.get("predicted_step_seconds"),
                "compute_step_s": decision.get("compute_seconds"),
                "sync_s": decision.get("sync_seconds"),
                "fastest_step_s": decision.get("fastest_step_seconds"),
                "window_predicted_step_s": record.predicted_step_seconds,
                "measured_step_s": record.step_seconds,
                "measured_compute_s": record.compute_seconds,
                "measured_backward_s": record.backward_seconds,
                "measured_hideable_s": record.hideable_seconds,
                "measured_comm_busy_s": record.comm_busy_seconds,
                "measured_work_s": record.compress_seconds,
                "measured_exposed_s": record.exposed_seconds,
                "sent_bytes_per_step": record.bytes_per_step,
                "bandwidth_bytes_per_s": decision.get("bandwidth_bytes_per_s"),
                "layers": layers,
            }
        )
    return trail


def worker_paths() -> dict[str, str]:
    """Where this worker imported the two packages from (the runner checks the snapshot)."""
    import autocomp
    import autocomp_bench

    return {
        "autocomp_path": str(Path(autocomp.__file__).parent),
        "bench_path": str(Path(autocomp_bench.__file__).parent),
    }


# ---- loop: a fixed number of steps -----------------------------------------------------------


def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} after {timeout_s:.0f} s")
        time.sleep(0.05)


def train_steps(cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    """``total_steps`` steps, each timed from the forward start to the end of
    ``optimizer.step()`` (which includes waiting for the gradient communication)."""
    method: str = cfg["method"]
    total: int = cfg["total_steps"]
    # None: the policy preset's window (and warm-up); the convergence scenario uses those.
    window: int | None = cfg["window"]
    drop_step: int | None = cfg.get("drop_step")
    eval_every: int = cfg.get("eval_every") or 0
    sync_dir = Path(cfg["run_dir"])

    task, model, attached, opt = _build(cfg)
    ddp, ctl, bytes_per_step = attached.ddp, attached.ctl, attached.bytes_per_step
    numel = sum(p.numel() for p in model.parameters())
    info: dict[str, Any] = {}
    times: list[float] = []
    starts: list[float] = []
    backward_times: list[float] = []
    losses: list[float] = []
    bytes_cumulative: list[int] = []
    raw_cumulative: list[int] = []
    curve: list[dict[str, float]] = []
    eval_seconds = 0.0
    first_decision: int | None = None
    drop_wall: float | None = None
    started = time.perf_counter()
    for step in range(total):
        if drop_step is not None and step == drop_step:
            (sync_dir / f"reached-{rank}").write_text(str(step))
            waited = time.perf_counter()
            _wait_for(sync_dir / "dropped", DROP_SYNC_TIMEOUT_S)
            drop_wall = time.perf_counter() - waited
        if ctl is not None:
            counters = ctl.stats()
            bytes_cumulative.append(int(counters["bytes_sent"]))
            raw_cumulative.append(int(counters["bytes_uncompressed"]))
        x, y = task.batch(rank, step, cfg["seed"])
        t0 = time.perf_counter()
        starts.append(t0)
        loss = task.loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        times.append(t2 - t0)
        backward_times.append(t1 - t0)
        value = float(loss.item())
        losses.append(value)
        if ctl is not None:
            ctl.observe_loss(value)
            if first_decision is None and ctl.history:
                first_decision = ctl.history[0].step
        if rank == 0:
            logger.info("%s step %d: %.3f s, loss %.3f", method, step, t2 - t0, value)
        if eval_every and (step + 1) % eval_every == 0:
            # Every rank evaluates (same model), so neither waits for the other at the next
            # collective and autocomp's link measurements see no skew.
            evaluated = time.perf_counter()
            curve.append({"step": step + 1, **task.evaluate(model)})
            eval_seconds += time.perf_counter() - evaluated
    train_seconds = time.perf_counter() - started

    if ctl is not None and method == "static":
        bytes_cumulative.append(int(ctl.stats()["bytes_sent"]))
        measure_from = cfg["warmup_steps"]
        measured = total - measure_from
        bytes_per_step = (bytes_cumulative[-1] - bytes_cumulative[measure_from]) / max(measured, 1)
        info = {"plan": ctl.plan}
    elif ctl is not None:
        final_stats = ctl.stats()
        bytes_cumulative.append(int(final_stats["bytes_sent"]))
        raw_cumulative.append(int(final_stats["bytes_uncompressed"]))
        if first_decision is None:
            raise RuntimeError(
                f"autocomp made no decision in {total} steps (window {window}); run more steps"
            )
        measure_from = first_decision
        measured = total - measure_from
        bytes_per_step = (bytes_cumulative[-1] - bytes_cumulative[measure_from]) / max(measured, 1)
        info = {
            "first_decision_step": first_decision,
            "plan": ctl.plan,
            "layers": final_stats["layers"],
            "window_lines": [record.summary() for record in ctl.history],
            "windows": [record.to_dict() for record in ctl.history],
            "bytes_per_step_all": [b - a for a, b in itertools.pairwise(bytes_cumulative)],
            "raw_bytes_per_step_all": [b - a for a, b in itertools.pairwise(raw_cumulative)],
        }
    else:
        measure_from = cfg["warmup_steps"]
        if method == "powersgd":
            info = {
                "compressed": [
                    name
                    for name, p in model.named_parameters()
                    if powersgd_wire_bytes(
                        [list(p.shape)], POWERSGD_RANK, POWERSGD_MIN_COMPRESSION_RATE
                    )
                    < 4 * p.numel()
                ],
                "bucket_cap_mb": POWERSGD_BUCKET_CAP_MB,
                "start_powerSGD_iter": POWERSGD_START_ITER,
            }
    result: dict[str, Any] = {
        "rank": rank,
        **worker_paths(),
        "method": method,
        "numel": numel,
        "total_steps": total,
        "measure_from": measure_from,
        "step_times": times,
        "backward_times": backward_times,
        "losses": losses,
        "bytes_per_step": bytes_per_step,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "valid_curve": curve,
        "drop_wait_seconds": drop_wall,
        "info": info,
    }
    if rank == 0:
        measured_times = times[measure_from:]
        result["median_step_s"] = statistics.median(measured_times) if measured_times else None
        # Forward start to the next forward start (includes making the batch): the step the
        # advisor predicts.
        intervals = [b - a for a, b in itertools.pairwise(starts[measure_from:])]
        result["median_interval_s"] = statistics.median(intervals) if intervals else None
        result["median_backward_s"] = (
            statistics.median(backward_times[measure_from:]) if measured_times else None
        )
        result["final_loss"] = statistics.fmean(losses[-FINAL_LOSS_STEPS:])
        result.update(task.evaluate(model))
    if ctl is not None:
        ctl.close()
    return result


# ---- loop: a wall-clock budget ---------------------------------------------------------------


def eval_points(budget_s: float, evals: int) -> list[float]:
    """Training seconds at which to evaluate before the end: ``evals`` evenly spaced points."""
    return [budget_s * k / (evals + 1) for k in range(1, evals + 1)]


def train_budget(cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    """Train until ``budget_s`` seconds of training (evaluation excluded) have passed.

    Both ranks must stop at the same step, so after every ``optimizer.step()`` each rank
    all-reduces (MAX) its own training seconds: both then see the same clock, evaluate at the
    same steps (every rank, clock paused) and stop at the same step. The clock's 8-byte
    all-reduce is part of every method's step time alike.
    """
    import torch
    import torch.distributed as dist

    method: str = cfg["method"]
    budget: float = cfg["budget_s"]
    seed: int = cfg["seed"]
    task, model, attached, opt = _build(cfg)
    ddp, ctl = attached.ddp, attached.ctl
    numel = sum(p.numel() for p in model.parameters())
    points = eval_points(budget, cfg["evals"])
    curve: list[dict[str, float]] = []
    clock: list[float] = []
    recent: list[float] = []
    paused = 0.0

    def evaluate(steps: int, at: float) -> None:
        nonlocal paused
        began = time.perf_counter()
        metrics = task.evaluate(model)
        window = recent[-FINAL_LOSS_STEPS:]
        train_loss = statistics.fmean(window) if window else math.nan
        curve.append({"step": steps, "train_seconds": at, "train_loss": train_loss, **metrics})
        paused += time.perf_counter() - began

    started = time.perf_counter()
    step = 0
    next_point = 0
    agreed = 0.0
    while agreed < budget:
        x, y = task.batch(rank, step, seed)
        loss = task.loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = float(loss.item())
        if method == "adaptive":
            ctl.observe_loss(value)
        elapsed = torch.tensor([time.perf_counter() - started - paused], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        agreed = float(elapsed.item())
        step += 1
        clock.append(agreed)
        recent = [*recent[-FINAL_LOSS_STEPS + 1 :], value]
        if next_point < len(points) and agreed >= points[next_point]:
            while next_point < len(points) and agreed >= points[next_point]:
                next_point += 1  # a slow step may pass several points: one evaluation
            if agreed < budget:
                evaluate(step, agreed)
    evaluate(step, agreed)

    step_times = [clock[0], *(b - a for a, b in itertools.pairwise(clock))]
    info: dict[str, Any] = {}
    bytes_per_step = attached.bytes_per_step
    if ctl is not None:
        bytes_per_step = ctl.stats()["bytes_sent"] / step
        info["plan"] = ctl.plan
        if getattr(ctl, "adaptive", None) is not None:  # adaptive DDP or wrap_fsdp
            info["decisions"] = len(ctl.history)
            info["first_decision_step"] = ctl.history[0].step if ctl.history else None
            info["trail"] = decision_trail(ctl.history)
            # The loop's own time (probes, decisions, plan broadcasts), apart from the steps'.
            info["opening_seconds"] = ctl.adaptive.opening_seconds
            info["boundary_seconds"] = ctl.adaptive.boundary_seconds
        ctl.close()
    elif method == "powersgd" and bytes_per_step is not None:
        # powerSGD_hook all-reduces the raw gradient for its first start_powerSGD_iter steps.
        raw_steps = min(POWERSGD_START_ITER, step)
        bytes_per_step = (raw_steps * 4.0 * numel + (step - raw_steps) * bytes_per_step) / step
    return {
        "rank": rank,
        **worker_paths(),
        "method": method,
        "task": task.name,
        "numel": numel,
        "steps": step,
        "step_times": step_times,
        "train_seconds": agreed,
        "eval_seconds": paused,
        "bytes_per_step": bytes_per_step,
        "curve": curve,
        "info": info,
    }


def train_in_turn(cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    """Several methods stepped in turn (``autocomp-bench in-turn``, which imports this module)."""
    from autocomp_bench.in_turn import train_in_turn as loop

    return loop(cfg, rank)


LOOPS: dict[str, Callable[[dict[str, Any], int], dict[str, Any]]] = {
    "steps": train_steps,
    "budget": train_budget,
    "in_turn": train_in_turn,
}


# ---- process entry ---------------------------------------------------------------------------


def worker_main(config_path: Path) -> int:
    """One rank: read the run's config, train, write ``result-rank{RANK}.json``."""
    import torch
    import torch.distributed as dist

    cfg = json.loads(config_path.read_text(encoding="utf-8"))
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"[rank {rank} %(asctime)s] %(name)s: %(message)s",
    )
    torch.set_num_threads(cfg["threads"])
    dist.init_process_group(
        "gloo",
        init_method="env://",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=cfg["gloo_timeout_s"]),
    )
    try:
        result = LOOPS[cfg.get("loop", "steps")](cfg, rank)
    finally:
        dist.destroy_process_group()
        # DDP's reducer sits in reference cycles: collect it while the interpreter is alive
        # (left to its shutdown, gloo's threads can touch Python objects and abort).
        gc.collect()
    out = Path(cfg["run_dir"]) / f"result-rank{rank}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=str), encoding="utf-8")
    tmp.replace(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m autocomp_bench.worker CONFIG.json", file=sys.stderr)
        return 2
    return worker_main(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
