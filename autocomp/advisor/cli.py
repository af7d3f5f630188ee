"""``autocomp-advisor``: profile a training script, then ask what compression would do elsewhere.

    autocomp-advisor profile train.py [--steps N] [--nproc N] [--out profile.json] [-- ARGS]
    autocomp-advisor recommend profile.json --bandwidth 10Gbit --world-size 64 [--latency 2ms]
        [--target-overlap 0.9] [--json out.json] [--html out.html] [--plan-out plan.json]
    autocomp-advisor report RUN_DIR [--json out.json]

Exit status: 0 success; 1 the script failed, built no DDP model, or the run could not be
summarized; 2 bad usage or unusable input (missing script, corrupt profile, absurd values).
See docs/advisor.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from autocomp.advisor.profile import Profile, ProfileError
from autocomp.advisor.units import BANDWIDTH_HELP, LATENCY_HELP, parse_bandwidth, parse_latency

if TYPE_CHECKING:
    from autocomp.advisor.whatif import Evaluation, Verdict, WhatIfModel

logger = logging.getLogger(__name__)

__all__ = ["build_parser", "main"]

PROG = "autocomp-advisor"
MAX_WORLD_SIZE = 1_000_000
"""Largest what-if world size accepted."""
DEFAULT_LATENCY_S = 50e-6
"""What-if latency per hop when neither --latency nor a measured link is available."""


# ---- argument types (argparse turns ArgumentTypeError into a usage error, exit 2) -----------


def _bandwidth(text: str) -> float:
    try:
        return parse_bandwidth(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _latency(text: str) -> float:
    try:
        return parse_latency(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _world_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"world size must be an integer, got {text!r}") from None
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"world size must be >= 2 (one rank communicates nothing), got {value}"
        )
    if value > MAX_WORLD_SIZE:
        raise argparse.ArgumentTypeError(f"world size {value} is above {MAX_WORLD_SIZE}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text}")
    return value


def _fraction(what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a fraction, got {text!r}") from None
        if not 0 < value <= 1:
            raise argparse.ArgumentTypeError(f"{what} must be in (0, 1], got {text}")
        return value

    return parse


_overlap = _fraction("target overlap")
_efficiency = _fraction("payload efficiency")


# ---- parser ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Profile a DDP training script and predict what gradient compression "
        "would do on another link and at another scale.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    profile = commands.add_parser(
        "profile",
        help="run a training script for a few steps and record its profile",
        description="Run SCRIPT unmodified for --steps optimizer steps and write a profile. "
        "Without torchrun's environment it starts --nproc local gloo ranks itself; under "
        f"'torchrun ... -m autocomp.advisor profile' each rank profiles itself. Arguments for "
        f"the script go after '--': {PROG} profile train.py --steps 20 -- --batch 32",
    )
    profile.add_argument("script", help="the training script (a plain DDP script)")
    profile.add_argument("--steps", type=_positive_int, default=20, help="steps (default 20)")
    profile.add_argument(
        "--nproc", type=_positive_int, default=2, help="local ranks to spawn (default 2)"
    )
    profile.add_argument(
        "--out", type=Path, default=Path("profile.json"), help="default profile.json"
    )
    profile.add_argument(
        "--compressor-budget",
        type=_seconds,
        default=20.0,
        help="seconds for timing compressors on rank 0 (default 20; 0 skips)",
    )
    profile.add_argument(
        "--link-budget",
        type=_seconds,
        default=5.0,
        help="seconds for the all-reduce link probe (default 5)",
    )
    profile.add_argument(
        "--timeout", type=_seconds, default=1800.0, help="kill spawned ranks after (s)"
    )
    profile.set_defaults(func=_cmd_profile)

    recommend = commands.add_parser(
        "recommend",
        help="predict step time and scaling for each compression option on a what-if link",
        description="Predict, from a profile, the step time and scaling efficiency of "
        "uncompressed, fp16, PowerSGD, top-k and the adaptive per-layer plan on a link of "
        "--bandwidth with --world-size ranks, and say whether compression pays.",
    )
    recommend.add_argument("profile", type=Path, help="profile.json from 'profile'")
    recommend.add_argument(
        "--bandwidth", type=_bandwidth, required=True, help=f"per-rank link, {BANDWIDTH_HELP}"
    )
    recommend.add_argument("--world-size", type=_world_size, required=True, help="ranks")
    recommend.add_argument(
        "--latency",
        type=_latency,
        default=None,
        help=f"per-hop latency, {LATENCY_HELP} (default: the profiled link's, else 50us)",
    )
    recommend.add_argument(
        "--payload-efficiency",
        type=_efficiency,
        default=None,
        help="share of --bandwidth that carries data (default 0.956: TCP in 1500-byte "
        "Ethernet frames; 0.993 for 9000-byte jumbo frames; 1 when --bandwidth is a "
        "measured goodput)",
    )
    recommend.add_argument(
        "--target-overlap",
        type=_overlap,
        default=None,
        help="overlap target of the adaptive plan (default: the policy's, 0.9)",
    )
    recommend.add_argument("--policy", default="default", help="policy preset or TOML file")
    recommend.add_argument(
        "--model", type=int, default=None, help="model index when the script built several"
    )
    recommend.add_argument("--json", type=Path, default=None, help="write the advice as JSON")
    recommend.add_argument("--html", type=Path, default=None, help="write a self-contained page")
    recommend.add_argument(
        "--plan-out",
        type=Path,
        default=None,
        help="write the recommended per-layer plan (autocomp.plan JSON) and, next to it, "
        "a warm-start cost model (NAME.cost.json)",
    )
    recommend.add_argument(
        "--sweep-points", type=_positive_int, default=33, help="bandwidths in the HTML sweep"
    )
    recommend.set_defaults(func=_cmd_recommend)

    report = commands.add_parser(
        "report",
        help="summarize a past run from its run log",
        description="Summarize an autocomp run from its run log directory: what the link "
        "did, which plans were chosen and why, and what the guards did.",
    )
    report.add_argument("run_dir", type=Path, help="the run's log directory")
    report.add_argument("--json", type=Path, default=None, help="write the summary as JSON")
    report.set_defaults(func=_cmd_report)
    return parser


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _output_problem(option: str, path: Path) -> str | None:
    """Why ``path`` cannot be written as ``option``'s output file, or None if it can.

    Checked before any work: a profile run takes minutes, and a failed write at its end
    would lose it (and leave a half-written temporary file).
    """
    target = path.expanduser()
    if target.is_dir():
        return f"{option}: {path} is a directory; give a file name"
    parent = target.resolve().parent
    if not parent.is_dir():
        return f"{option}: directory {parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{option}: directory {parent} is not writable"
    if target.exists() and not os.access(target, os.W_OK):
        return f"{option}: {path} is not writable"
    return None


def _first_output_problem(outputs: list[tuple[str, Path | None]]) -> str | None:
    for option, path in outputs:
        if path is not None and (problem := _output_problem(option, path)):
            return problem
    return None


def _console() -> Console:
    """stdout console; not a terminal (pipes, tests): wide enough for the tables."""
    console = Console()
    if not console.is_terminal:
        width = max(120, shutil.get_terminal_size((120, 24)).columns)
        console = Console(width=width, no_color=True, highlight=False)
    return console


# ---- commands --------------------------------------------------------------------------------


def _cmd_profile(args: argparse.Namespace, script_args: list[str]) -> int:
    from autocomp.advisor.runner import ProfileRunner

    script: Path = Path(args.script)
    if script.is_dir():
        return _error(f"script {script} is a directory; give the training script in it")
    if not script.is_file():
        return _error(f"script not found: {script}")
    out: Path = args.out
    if problem := _output_problem("--out", out):
        return _error(problem)
    if args.timeout <= 0:
        return _error("--timeout must be > 0")
    runner = ProfileRunner(
        ProfileRunner.Config(
            script=script,
            script_args=tuple(script_args),
            steps=args.steps,
            nproc=args.nproc,
            out=out,
            compressor_budget_s=args.compressor_budget,
            link_budget_s=args.link_budget,
            timeout_s=args.timeout,
        )
    )
    if "RANK" in os.environ:
        return runner.run_rank()
    return runner.spawn()


def _cmd_recommend(args: argparse.Namespace, script_args: list[str]) -> int:
    from autocomp.advisor.planout import cost_path_for
    from autocomp.advisor.report import (
        Advice,
        render_html,
        render_terminal,
        sweep_bandwidths,
        to_json,
    )
    from autocomp.advisor.whatif import TCP_ETHERNET_EFFICIENCY, Scenario, WhatIfModel

    outputs: list[tuple[str, Path | None]] = [("--json", args.json), ("--html", args.html)]
    if args.plan_out is not None:
        outputs += [("--plan-out", args.plan_out), ("--plan-out", cost_path_for(args.plan_out))]
    if problem := _first_output_problem(outputs):
        return _error(problem)
    try:
        profile = Profile.load(args.profile)
    except ProfileError as err:
        return _error(str(err))
    try:
        model = WhatIfModel(
            profile,
            args.model,
            WhatIfModel.Config(policy=args.policy, target_overlap=args.target_overlap),
        )
    except (ProfileError, ValueError) as err:
        return _error(str(err).splitlines()[0])
    if args.latency is not None:
        latency, source = args.latency, "--latency"
    elif profile.link is not None:
        latency, source = profile.link.latency_s, "as measured on the profiling link"
    else:
        latency, source = DEFAULT_LATENCY_S, "a 50 us default"
    efficiency = (
        TCP_ETHERNET_EFFICIENCY if args.payload_efficiency is None else args.payload_efficiency
    )
    scenario = Scenario(
        bandwidth_bytes_per_s=args.bandwidth,
        latency_s=latency,
        world_size=args.world_size,
        payload_efficiency=efficiency,
    )
    evaluation = model.evaluate(scenario)
    verdict = model.verdict(evaluation)
    advice = Advice(
        profile=profile,
        profile_path=str(args.profile),
        model=model,
        evaluation=evaluation,
        verdict=verdict,
        latency_source=source,
        model_requested=args.model is not None,
    )
    if args.html is not None or args.json is not None:
        bandwidths = sweep_bandwidths(max(2, args.sweep_points))
        advice.sweep_bandwidths = bandwidths
        advice.sweep = model.sweep(
            bandwidths,
            world_size=args.world_size,
            latency_s=latency,
            payload_efficiency=efficiency,
        )
    if args.plan_out is not None:
        advice.plan_path, advice.cost_path = _write_plan(args.plan_out, model, evaluation, verdict)
    render_terminal(advice, _console())
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(advice), indent=1) + "\n", encoding="utf-8")
    if args.html is not None:
        args.html.write_text(render_html(advice), encoding="utf-8")
    return 0


def _write_plan(
    path: Path, model: WhatIfModel, evaluation: Evaluation, verdict: Verdict
) -> tuple[str, str]:
    """The recommended option's per-layer plan and the warm-start cost model next to it."""
    from autocomp.advisor.planout import cost_path_for, plan_for, write_plan

    key = verdict.option or "none"
    plan = plan_for(evaluation.result(key).plan)
    cost_path = cost_path_for(path)
    write_plan(plan, path, model.cost_model(evaluation.scenario.world_size), cost_path)
    return str(path), str(cost_path)


def _cmd_report(args: argparse.Namespace, script_args: list[str]) -> int:
    if args.json is not None and (problem := _output_problem("--json", args.json)):
        return _error(problem)
    try:
        from autocomp.advisor.runreport import summarize
    except ImportError as err:
        return _error(f"run log support is not available: {err}")
    return summarize(args.run_dir, _console(), json_path=args.json)


# ---- entry point -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    raw = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in raw:
        cut = raw.index("--")
        raw, script_args = raw[:cut], raw[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(raw)
    if script_args and args.command != "profile":
        parser.error("arguments after '--' are only for 'profile' (the script's arguments)")
    if args.verbose:
        # Only on request: under 'profile' the script shares this process, and a root handler
        # installed here would turn the script's own logging.basicConfig into a no-op.
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args, script_args))
