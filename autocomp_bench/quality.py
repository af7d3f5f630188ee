"""Per-step quality: does a compressor learn as much per step as its reference?

Speed aside, a compressor is only worth its bytes if the model learns nearly as much per step
as without it. This benchmark trains one task on two local gloo ranks (loopback, so the link
does not matter) once per method and seed, from the same initial weights and batches, and
reports the validation metric every ``--eval-every`` steps. Methods:

* ``ddp``: plain DDP all-reduce, the uncompressed reference;
* ``torch-fp16``: PyTorch's ``fp16_compress_hook``;
* ``torch-powersgd:R``: PyTorch's ``powerSGD_hook`` at rank R (error feedback, warm start,
  ``start_powerSGD_iter=2``, one bucket: it aborts with several on gloo);
* ``autocomp:SPEC``: ``autocomp.wrap(ddp, plan={"*": SPEC}, warmup_steps=2)``, every
  parameter on SPEC (a compressor that cannot compress a tensor, PowerSGD on a bias, sends it
  as it is), after the same 2 uncompressed steps PyTorch's PowerSGD hook must take;
* ``nothing``: a hook that sends nothing (every rank keeps its own gradient): what training
  without communication learns, for scale.

Each ``autocomp:SPEC`` row is compared with its reference: PyTorch's hook of the same kind
where one exists (PowerSGD at the same rank, fp16), else ``ddp``.

    python -m autocomp_bench.quality --task gpt --steps 150 --seeds 0,1,2 \\
        --methods ddp,torch-powersgd:4,autocomp:powersgd:rank=4
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import logging
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from autocomp_bench.worker import send_nothing

logger = logging.getLogger(__name__)

__all__ = ["QualityRun", "main", "reference_of", "run_quality", "summarize"]

WORLD_SIZE = 2
TORCH_POWERSGD_START_ITER = 2
"""PyTorch requires start_powerSGD_iter >= 2 when error feedback or warm start is on."""


def reference_of(method: str) -> str | None:
    """The method an ``autocomp:`` method is judged against (None for the references)."""
    if not method.startswith("autocomp:"):
        return None
    from autocomp.compressors import PowerSGD, build_compressor

    compressor = build_compressor(method.split(":", 1)[1])
    if isinstance(compressor, PowerSGD):
        return f"torch-powersgd:{compressor.config['rank']}"
    if compressor.name == "fp16":
        return "torch-fp16"
    return "ddp"


def _validate_method(method: str) -> None:
    if method in ("ddp", "torch-fp16", "nothing"):
        return
    if method.startswith("torch-powersgd:"):
        rank = method.split(":", 1)[1]
        if not rank.isdigit() or int(rank) < 1:
            raise ValueError(f"{method!r}: expected torch-powersgd:RANK with RANK >= 1")
        return
    if method.startswith("autocomp:"):
        from autocomp.compressors import build_compressor

        build_compressor(method.split(":", 1)[1])  # raises ValueError naming what is valid
        return
    raise ValueError(
        f"unknown method {method!r}; valid: ddp, torch-fp16, torch-powersgd:R, nothing, "
        "autocomp:SPEC"
    )


def _attach(method: str, model: torch.nn.Module, seed: int) -> tuple[DDP, Any]:
    """DDP around ``model`` with the method's comm hook; returns (ddp, controller or None)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    import autocomp

    if method.startswith("torch-powersgd:"):
        ddp = DDP(model, bucket_cap_mb=10_000)
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=int(method.split(":", 1)[1]),
            start_powerSGD_iter=TORCH_POWERSGD_START_ITER,
            use_error_feedback=True,
            warm_start=True,
            random_seed=seed,
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return ddp, None
    ddp = DDP(model)
    if method == "torch-fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif method == "nothing":
        ddp.register_comm_hook(None, send_nothing)
    elif method.startswith("autocomp:"):
        spec = method.split(":", 1)[1]
        return ddp, autocomp.wrap(
            ddp, plan={"*": spec}, seed=seed, warmup_steps=TORCH_POWERSGD_START_ITER
        )
    return ddp, None


def _train(
    task_name: str, method: str, seed: int, steps: int, eval_every: int, rank: int
) -> list[dict[str, float]]:
    from autocomp_bench.tasks import build_task

    task = build_task(task_name)
    torch.manual_seed(seed)
    model = task.build_model()
    ddp, ctl = _attach(method, model, seed)
    optimizer = task.make_optimizer(ddp.parameters())
    curve: list[dict[str, float]] = []
    for step in range(steps):
        x, y = task.batch(rank, step, seed)
        loss = task.loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            # Every rank evaluates the same weights (except "nothing", where rank 0's count).
            curve.append(
                {"step": step + 1, "train_loss": float(loss.detach()), **task.evaluate(model)}
            )
    if ctl is not None:
        ctl.close()
    return curve


def _rank_main(rank: int, store: str, jobs: list[dict[str, Any]], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, WORLD_SIZE),
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=datetime.timedelta(seconds=300),
    )
    try:
        results = []
        for job in jobs:
            curve = _train(job["task"], job["method"], job["seed"], job["steps"], job["eval"], rank)
            results.append({**job, "curve": curve})
            # The job's DDP model sits in reference cycles with its reducer and pending
            # futures: free it now, while the group is alive. Left to the interpreter's exit
            # (18 of them in tests/test_quality.py), gloo aborted a rank now and then
            # ("terminate called without an active exception"), after the work was done.
            gc.collect()
            if rank == 0:
                last = curve[-1]
                logger.info("%s seed %d: %s", job["method"], job["seed"], last)
        if rank == 0:
            Path(out).write_text(json.dumps(results))
    finally:
        gc.collect()
        dist.destroy_process_group()


@dataclass(frozen=True, slots=True)
class QualityRun:
    """One benchmark invocation's settings."""

    task: str
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    eval_every: int


def run_quality(run: QualityRun) -> list[dict[str, Any]]:
    """Train every (seed, method) on two local gloo ranks; one result per pair."""
    from autocomp_bench.tasks import build_task

    build_task(run.task)  # unknown task: ValueError before any process starts
    for method in run.methods:
        _validate_method(method)
    jobs = [
        {"task": run.task, "method": m, "seed": s, "steps": run.steps, "eval": run.eval_every}
        for s in run.seeds
        for m in run.methods
    ]
    with tempfile.TemporaryDirectory(prefix="autocomp-quality-") as tmp:
        out = str(Path(tmp) / "results.json")
        mp.start_processes(
            _rank_main,
            args=(str(Path(tmp) / "store"), jobs, out),
            nprocs=WORLD_SIZE,
            start_method="spawn",
        )
        return list(json.loads(Path(out).read_text()))


def summarize(results: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """Per method: the final metric per seed, its mean, and the mean gap to its reference
    (method minus reference, paired by seed)."""
    final: dict[str, dict[int, float]] = {}
    for result in results:
        final.setdefault(result["method"], {})[result["seed"]] = result["curve"][-1][metric]
    rows = []
    for method, by_seed in final.items():
        reference = reference_of(method)
        gaps = None
        if reference is not None and reference in final:
            paired = sorted(set(by_seed) & set(final[reference]))
            gaps = [by_seed[s] - final[reference][s] for s in paired] or None
        rows.append(
            {
                "method": method,
                "reference": reference,
                "by_seed": by_seed,
                "mean": statistics.fmean(by_seed.values()),
                "gap_to_reference": None if gaps is None else statistics.fmean(gaps),
            }
        )
    return rows


def _markdown(run: QualityRun, rows: list[dict[str, Any]], metric: str) -> str:
    seeds = ", ".join(map(str, run.seeds))
    lines = [
        f"Task `{run.task}`, {run.steps} steps, 2 gloo ranks on loopback, seeds {seeds}; "
        f"{metric} at the last step.",
        "",
        f"| method | {metric} (mean) | per seed | reference | gap to reference |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        per_seed = " / ".join(f"{v:.4f}" for _, v in sorted(row["by_seed"].items()))
        gap = "" if row["gap_to_reference"] is None else f"{row['gap_to_reference']:+.4f}"
        lines.append(
            f"| {row['method']} | {row['mean']:.4f} | {per_seed} | {row['reference'] or ''} "
            f"| {gap} |"
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    from autocomp_bench.tasks import TASKS

    parser = argparse.ArgumentParser(
        prog="autocomp-bench quality", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--task", default="gpt", choices=TASKS)
    parser.add_argument(
        "--methods",
        default="ddp,torch-powersgd:4,autocomp:powersgd:rank=4,torch-fp16,autocomp:fp16:ef=false",
        help="comma-separated; autocomp:SPEC specs may contain commas only inside SPEC's "
        "parameters, so separate methods with ';' when they do",
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--json", type=Path, help="write every curve here")
    parser.add_argument("--markdown", type=Path, help="write the summary table here")
    return parser


def _split_methods(text: str) -> tuple[str, ...]:
    separator = ";" if ";" in text else ","
    if separator == "," and "autocomp:" in text and "=" in text:
        # Commas also separate a spec's parameters: split before each method name instead.
        parts: list[str] = []
        for item in text.split(","):
            starts = item.startswith(("ddp", "torch-", "nothing", "autocomp:"))
            if parts and not starts:
                parts[-1] += "," + item
            else:
                parts.append(item)
        return tuple(p.strip() for p in parts if p.strip())
    return tuple(p.strip() for p in text.split(separator) if p.strip())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from autocomp_bench.tasks import build_task

    try:
        seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
        run = QualityRun(
            task=args.task,
            methods=_split_methods(args.methods),
            seeds=seeds,
            steps=args.steps,
            eval_every=args.eval_every,
        )
        if run.steps < 1 or run.eval_every < 1 or not run.seeds or not run.methods:
            raise ValueError("steps and eval-every must be >= 1, with at least one seed/method")
        for method in run.methods:
            _validate_method(method)
    except ValueError as err:
        print(f"autocomp-bench quality: {err}", file=sys.stderr)
        return 2
    results = run_quality(run)
    metric = build_task(run.task).metric
    rows = summarize(results, metric)
    text = _markdown(run, rows, metric)
    print(text)
    if args.json:
        document = {"run": _settings(run), "results": results, "summary": rows}
        args.json.write_text(json.dumps(document, indent=1))
    if args.markdown:
        args.markdown.write_text(text)
    return 0


def _settings(run: QualityRun) -> dict[str, Any]:
    return {name: getattr(run, name) for name in run.__slots__}


if __name__ == "__main__":
    raise SystemExit(main())
