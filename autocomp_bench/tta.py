"""Time to accuracy: what each method reaches in the same wall-clock training budget.

Run as::

    autocomp-bench tta [--tasks mlp-lm,gpt,cnn,ngram] [--rates 10mbit,50mbit,200mbit,unshaped]
        [--methods allreduce,fp16,powersgd,limit,adaptive,oracle] [--budget-s 60] [--evals 8]
        [--adaptive-kwargs JSON] [--oracle-grid NAMES|JSON] [--quick]
        [--json out.json] [--markdown out.md] [--plot out.png]

(or ``python -m autocomp_bench.tta``). Step time alone does not say whether compression is
worth it: a compressor that halves the step but learns less per step can still lose. Here
every method trains a fresh model of each task (:mod:`autocomp_bench.tasks`) from the same
seed for the same wall-clock budget of training (evaluation excluded) on 2 gloo ranks, each
in its own network namespace on a ``tc tbf``-shaped veth (:mod:`autocomp_bench.harness`;
without root, loopback only), and the report compares the validation metric they reach.
Methods: ``allreduce`` (plain DDP), ``fp16`` and ``powersgd`` (PyTorch's hooks), ``limit``
(a hook that sends nothing: the compute-only limit), ``adaptive`` (``autocomp.wrap(ddp,
**adaptive_kwargs)``) and ``oracle`` (the best static autocomp plan of a small grid, each
grid plan run on its own). Definitions and checks: :mod:`autocomp_bench.tta_analysis`.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autocomp_bench.harness import (
    GLOO_TIMEOUT_S,
    SEED,
    Network,
    Rate,
    Runner,
    add_network_option,
    choose_network,
    code_source,
    exit_on_sigterm,
    machine_summary,
    open_network,
    parse_rates,
    snapshot_code,
)
from autocomp_bench.machine import load_average
from autocomp_bench.report import MB, jsonable
from autocomp_bench.tta_analysis import METHODS, Cell, summarize_run, tta_checks, tta_rows
from autocomp_bench.tta_report import cell_lines, plot_curves, render_markdown, text_report

logger = logging.getLogger(__name__)

__all__ = ["TimeToAccuracy", "main", "parse_grid"]

DEFAULT_TASKS = "mlp-lm,gpt,cnn,ngram"
DEFAULT_RATES = "10mbit,50mbit,200mbit,unshaped"
DEFAULT_ADAPTIVE_KWARGS: dict[str, Any] = {"target_overlap": 0.9}
DEFAULT_GRID: dict[str, dict[str, str]] = {
    "fp16": {"*": "fp16:ef=false"},
    "psgd1": {"*": "powersgd:rank=1"},
    "psgd4": {"*": "powersgd:rank=4"},
    "psgd16": {"*": "powersgd:rank=16"},
    "topk": {"*": "topk:ratio=0.01"},
}
ORACLE_WARMUP_STEPS = 2
"""Uncompressed steps of every grid plan, as PyTorch's PowerSGD hook takes."""
QUICK = {"tasks": "cnn,mlp-lm", "rates": "50mbit,unshaped", "budget_s": 10.0, "evals": 2}
QUICK_GRID = "fp16,psgd4"
STARTUP_S = 90.0
"""Per run: starting both interpreters, importing torch, building the task, DDP set-up."""
EVAL_MARGIN_S = 15.0
"""Per evaluation: the largest validation set takes about a second; the rest is slack."""


@dataclass(frozen=True, slots=True)
class _Run:
    """One training run: a method (with its grid plan for the oracle) on one task and rate."""

    method: str
    grid: str | None = None


class TimeToAccuracy:
    """Runs every (rate, task, method) and turns the results into rows and checks."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        tasks: list[str] = field(default_factory=lambda: DEFAULT_TASKS.split(","))
        methods: list[str] = field(default_factory=lambda: list(METHODS))
        budget_s: float = 60.0
        """Training seconds per run (evaluation excluded)."""
        evals: int = 8
        """Validation points spread over the budget (plus one at the end)."""
        adaptive_kwargs: dict[str, Any] = field(
            default_factory=lambda: dict(DEFAULT_ADAPTIVE_KWARGS)
        )
        oracle_grid: dict[str, dict[str, str]] = field(default_factory=lambda: dict(DEFAULT_GRID))
        threads: int = 1
        """torch threads per rank."""
        seeds: list[int] = field(default_factory=lambda: [SEED])
        """Every method runs once per seed (model init and batches); rows are their means."""

    def __init__(self, config: Config, network: Network, runner: Runner) -> None:
        self.config = config
        self.network = network
        self.runner = runner
        self._gradient_bytes: dict[str, int] = {}

    def runs(self) -> list[_Run]:
        """The runs of one (task, rate), in a fixed order: the methods, then the grid."""
        out = [_Run(m) for m in self.config.methods if m != "oracle"]
        if "oracle" in self.config.methods:
            out += [_Run("oracle", name) for name in self.config.oracle_grid]
        return out

    def timeout_s(self, task: str, rate: Rate) -> float:
        """Budget, start-up, evaluations and two slowest-possible steps, with 50% slack.

        A step may start just before the budget runs out; at 10 Mbit/s one uncompressed step
        of the n-gram model's 33 MB gradient takes about 30 s.
        """
        c = self.config
        step = 2.0
        if rate.mbit is not None:
            step += self.gradient_bytes(task) * 8 / (rate.mbit * 1e6) / 0.9
        return 1.5 * (c.budget_s + (c.evals + 1) * EVAL_MARGIN_S + 2 * step) + STARTUP_S

    def gradient_bytes(self, task: str) -> int:
        if task not in self._gradient_bytes:
            from autocomp_bench.tasks import build_task

            model = build_task(task).build_model()
            self._gradient_bytes[task] = 4 * sum(p.numel() for p in model.parameters())
        return self._gradient_bytes[task]

    def worker_config(self, task: str, run: _Run, seed: int = SEED) -> dict[str, Any]:
        c = self.config
        cfg: dict[str, Any] = {
            "loop": "budget",
            "task": task,
            "method": run.method,
            "seed": seed,
            "threads": c.threads,
            "budget_s": c.budget_s,
            "evals": c.evals,
        }
        if run.method == "adaptive":
            cfg["adaptive_kwargs"] = c.adaptive_kwargs
        elif run.method == "oracle":
            assert run.grid is not None
            cfg.update(
                method="static",
                plan=c.oracle_grid[run.grid],
                plan_warmup_steps=ORACLE_WARMUP_STEPS,
            )
        return cfg

    def run_cell(self, task: str, rate: Rate) -> list[dict[str, Any]]:
        """Every method (and grid plan) on one task at the current rate; their summaries."""
        timeout = self.timeout_s(task, rate)
        summaries = []
        seeds = self.config.seeds
        # Seed by seed, every method once: the methods alternate in time, so a machine that
        # slows down during the cell does not favour whichever method ran its seeds first.
        for seed, run in ((seed, run) for seed in seeds for run in self.runs()):
            label = run.method if run.grid is None else f"oracle:{run.grid}"
            if len(seeds) > 1:
                label += f" s{seed}"
            print(f"   {label:<14} ...", end="", flush=True)
            result = self.runner.run(
                f"{task}-{rate.label}-{label}".replace(":", "-").replace(" ", "-"),
                self.worker_config(task, run, seed),
                timeout,
            )
            summary = {
                "task": task,
                "rate": rate.label,
                "rate_mbit": rate.mbit,
                "method": run.method,
                "grid": run.grid,
                "seed": seed,
                **summarize_run(result),
            }
            summaries.append(summary)
            if "error" in summary:
                print(f" FAILED: {summary['error']}", flush=True)
                continue
            accuracy = summary["valid_accuracy"]
            sent = summary["bytes_per_step"]
            print(
                f" {summary['steps']} steps, median {summary['median_step_s']:.4f} s/step, "
                f"valid loss {summary['valid_loss']:.4f}"
                + ("" if accuracy is None else f", accuracy {accuracy:.2%}")
                + ("" if sent is None else f", {sent / MB:.3f} MB/step")
                + f", wall {summary['wall_seconds']:.0f} s",
                flush=True,
            )
        return summaries

    def run(self, rates: list[Rate]) -> dict[str, Any]:
        """All cells, rate by rate (the link changes once per rate); rows and checks."""
        from autocomp_bench.tasks import build_task

        tasks = {name: build_task(name) for name in self.config.tasks}
        cells = [
            Cell(name, rate.label, rate.mbit, tasks[name].higher_is_better)
            for rate in rates
            for name in self.config.tasks
        ]
        runs: list[dict[str, Any]] = []
        for rate in rates:
            self.network.set_rate(rate.mbit)
            for name in self.config.tasks:
                print(
                    f"\n== {name} @ {rate.label}: {self.config.budget_s:g} s per method, "
                    f"timeout {self.timeout_s(name, rate):.0f} s per run",
                    flush=True,
                )
                runs += self.run_cell(name, rate)
                cell = next(c for c in cells if c.task == name and c.rate == rate.label)
                partial = {"rows": tta_rows(runs, [cell], self.config.methods)}
                print("\n".join(cell_lines(partial, cell)), flush=True)
        rows = tta_rows(runs, cells, self.config.methods)
        return {
            "cells": [asdict(c) for c in cells],
            "task_descriptions": {name: task.description for name, task in tasks.items()},
            "runs": runs,
            "rows": rows,
            "checks": tta_checks(rows, cells),
        }


# ---- command line ----------------------------------------------------------------------------


def parse_grid(text: str) -> dict[str, dict[str, str]]:
    """``fp16,psgd4`` (names from the default grid) or a JSON object ``{name: {glob: spec}}``."""
    from autocomp.compressors import build_compressor

    if text.lstrip().startswith("{"):
        grid = json.loads(text)
        if not isinstance(grid, dict) or not all(
            isinstance(plan, dict) and all(isinstance(v, str) for v in plan.values())
            for plan in grid.values()
        ):
            raise ValueError("--oracle-grid JSON must map names to {glob: spec} objects")
    else:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in DEFAULT_GRID]
        if unknown:
            raise ValueError(f"unknown grid plans {unknown}; choose from {', '.join(DEFAULT_GRID)}")
        grid = {n: DEFAULT_GRID[n] for n in names}
    if not grid:
        raise ValueError("--oracle-grid is empty")
    for plan in grid.values():
        for spec in plan.values():
            build_compressor(spec)  # ValueError naming what is valid
    return grid


def parse_adaptive_kwargs(text: str) -> dict[str, Any]:
    """A JSON object of keyword arguments ``autocomp.wrap`` accepts (checked here, not later
    on both ranks)."""
    import autocomp

    kwargs = json.loads(text)
    if not isinstance(kwargs, dict):
        raise ValueError("--adaptive-kwargs must be a JSON object")
    if "plan" in kwargs and "target_overlap" not in kwargs and "policy" not in kwargs:
        raise ValueError("--adaptive-kwargs: a plan without target_overlap or policy is static")
    try:
        inspect.signature(autocomp.wrap).bind(None, **kwargs)
    except TypeError as err:
        raise ValueError(f"--adaptive-kwargs: {err}") from None
    return kwargs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autocomp-bench tta",
        description="Time to accuracy: every method trains each task for the same wall-clock "
        "budget on 2 gloo ranks over a tbf-shaped link; the validation metric they reach.",
    )
    parser.add_argument("--tasks", default=None, help=f"default: {DEFAULT_TASKS}")
    parser.add_argument("--rates", default=None, help=f"default: {DEFAULT_RATES}")
    parser.add_argument("--methods", default=",".join(METHODS), help="default: %(default)s")
    parser.add_argument(
        "--budget-s", type=float, default=None, help="training seconds per run (default: 60)"
    )
    parser.add_argument(
        "--evals", type=int, default=None, help="validation points before the end (default: 8)"
    )
    parser.add_argument(
        "--adaptive-kwargs",
        default=json.dumps(DEFAULT_ADAPTIVE_KWARGS),
        help="JSON keyword arguments of autocomp.wrap for adaptive (default: %(default)s)",
    )
    parser.add_argument(
        "--oracle-grid",
        default=None,
        help="grid plan names (default: all of "
        f"{', '.join(DEFAULT_GRID)}) or JSON {{name: {{glob: spec}}}}",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: tasks {QUICK['tasks']}, rates {QUICK['rates']}, "
        f"{QUICK['budget_s']:g} s, grid {QUICK_GRID} (explicit options win)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--seeds",
        default=str(SEED),
        help="comma-separated seeds; every method runs once per seed and the tables give "
        "the means (default: %(default)s)",
    )
    add_network_option(parser)
    parser.add_argument(
        "--gloo-timeout", type=float, default=GLOO_TIMEOUT_S, help="gloo timeout in seconds"
    )
    parser.add_argument("--json", type=Path, default=None, help="write all results as JSON")
    parser.add_argument("--markdown", type=Path, default=None, help="write a markdown section")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of the curves")
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        metavar="JSON",
        help="run nothing: re-render the report (text, --markdown, --plot) of a saved --json",
    )
    return parser


def _config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> TimeToAccuracy.Config:
    from autocomp_bench.tasks import TASKS

    tasks = [t.strip() for t in (args.tasks or _quick(args, "tasks")).split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        parser.error(f"--tasks: unknown {unknown}; choose from {', '.join(TASKS)}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        parser.error(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    budget = args.budget_s if args.budget_s is not None else float(_quick(args, "budget_s"))
    evals = args.evals if args.evals is not None else int(_quick(args, "evals"))
    if not budget > 0 or evals < 0 or args.threads < 1:
        parser.error("need --budget-s > 0, --evals >= 0 and --threads >= 1")
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds: need distinct seeds, got {args.seeds!r}")
    grid_text = args.oracle_grid or (QUICK_GRID if args.quick else ",".join(DEFAULT_GRID))
    try:
        grid = parse_grid(grid_text)
        adaptive_kwargs = parse_adaptive_kwargs(args.adaptive_kwargs)
    except ValueError as err:  # json.JSONDecodeError is a ValueError
        parser.error(str(err))
    return TimeToAccuracy.Config(
        tasks=tasks,
        methods=[m for m in METHODS if m in methods],
        budget_s=budget,
        evals=evals,
        adaptive_kwargs=adaptive_kwargs,
        oracle_grid=grid,
        threads=args.threads,
        seeds=seeds,
    )


def _quick(args: argparse.Namespace, key: str) -> Any:
    defaults = {"tasks": DEFAULT_TASKS, "rates": DEFAULT_RATES, "budget_s": 60.0, "evals": 8}
    return QUICK[key] if args.quick else defaults[key]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.from_json is not None:
        document = json.loads(args.from_json.read_text(encoding="utf-8"))
        print("\n".join(text_report(document)))
        return _write_outputs(document, args)
    config = _config(args, parser)
    try:
        rates = parse_rates(args.rates or _quick(args, "rates"))
    except ValueError as err:
        parser.error(str(err))
    shaped, reason = choose_network(args.network, parser)
    command = shlex.join(["autocomp-bench", "tta", *argv])
    print(f"autocomp time-to-accuracy benchmark: {command}", flush=True)
    why = reason if args.network == "auto" else "--network loopback"
    if not shaped:
        print(
            f"SHAPED LINK NOT USED ({why}): every run is on loopback, unshaped; these numbers "
            "say nothing about slow links.",
            flush=True,
        )
        rates = [Rate("unshaped (loopback)", None)]
    exit_on_sigterm()
    started = time.monotonic()
    document: dict[str, Any] = {"benchmark": "autocomp_bench.tta", "command": command}
    with tempfile.TemporaryDirectory(prefix="autocomp-tta-") as tmp:
        root = Path(tmp)
        code_dir, digest = snapshot_code(root)
        document["code_digest"] = digest
        document["code_source"] = code_source()
        print(f"code {digest} from {document['code_source']}", flush=True)
        runner_config = Runner.Config(gloo_timeout_s=args.gloo_timeout, code_dir=code_dir)
        with open_network(shaped) as network:
            document["machine"] = machine_summary(network, config.threads)
            if not shaped:
                document["machine"]["network"] = f"loopback, unshaped ({why})"
            benchmark = TimeToAccuracy(config, network, Runner(network, root, runner_config))
            document.update(benchmark.run(rates))
    document["settings"] = {
        **asdict(config),
        "rates": [r.label for r in rates],
        "rate_mbit": [r.mbit for r in rates],
    }
    document["runtime_s"] = time.monotonic() - started
    document["machine"]["load_average_after"] = load_average()
    document = jsonable(document)
    print()
    print("\n".join(text_report(document)), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return _write_outputs(document, args)


def _write_outputs(document: dict[str, Any], args: argparse.Namespace) -> int:
    """Write --markdown and --plot; exit status 0 only if every check passed."""
    if args.markdown is not None:
        args.markdown.write_text(render_markdown(document), encoding="utf-8")
        print(f"wrote {args.markdown}")
    if args.plot is not None:
        plot_curves(document, args.plot)
        print(f"wrote {args.plot}")
    return 0 if all(c["passed"] for c in document["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
