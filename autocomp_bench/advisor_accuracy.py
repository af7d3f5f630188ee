"""How close the advisor's predictions come to measured step times on the shaped link.

Run as::

    autocomp-bench advisor [--rates 50mbit,200mbit] [--profile-steps 20] [--steps N]
        [--json out.json] [--markdown out.md]

(or ``python -m autocomp_bench.advisor_accuracy``). Needs root and iproute2: it uses the
2-namespace tbf-shaped veth of :mod:`autocomp_bench.shaped_link`, like ``autocomp-bench link``.

What a user would do, end to end, on the link benchmark's workload (16.5M-parameter MLP LM,
Adam, batch 64, one torch thread per rank, 2 ranks; :mod:`autocomp_bench.lm_script`):

1. **Profile** the plain DDP script with ``autocomp-advisor profile --steps S``, one rank per
   namespace, on the *unshaped* veth (the user profiles on the machine they have).
2. **Predict** with the advisor's what-if model (:class:`~autocomp.advisor.whatif.WhatIfModel`)
   at each rate as ``recommend`` does by default: bandwidth = the tbf rate (tbf counts whole
   Ethernet frames, so the default TCP payload efficiency applies), latency = the profile's
   measured latency, 2 ranks.
3. **Measure** on the shaped link with the link benchmark's worker: plain DDP for
   ``none``; for ``fp16``, ``powersgd-r4`` and ``adaptive`` autocomp runs the very per-layer
   plan the advisor evaluated, as a static plan. The live controller
   (``wrap(target_overlap=0.9)``) runs too: it chooses its own plan from its own measurements,
   so its row compares the advisor's adaptive prediction with what autocomp really does.
4. **Compare** predicted and measured median step time, both forward start to the next
   forward start (what the profile calls a step). The check: every gated row within
   :data:`TOLERANCE` (20%).
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autocomp_bench.harness import (
    SEED,
    WORLD_SIZE,
    Network,
    Rate,
    Runner,
    ShapedNetwork,
    exit_on_sigterm,
    parse_rates,
    snapshot_code,
    worker_pythonpath,
)
from autocomp_bench.machine import tail
from autocomp_bench.rates import default_schedule, estimate_run_seconds
from autocomp_bench.report import MB, plan_summary
from autocomp_bench.shaped_link import ShapedLink, shaped_link_unavailable_reason

logger = logging.getLogger(__name__)

__all__ = ["TOLERANCE", "Comparison", "compare", "main"]

TOLERANCE = 0.20
"""Largest accepted |predicted - measured| / measured of a gated row."""
DEFAULT_RATES = "50mbit,200mbit"
PROFILE_STEPS = 20
PROFILE_TIMEOUT_S = 900.0
COMPRESSOR_BUDGET_S = 60.0
LIVE_WINDOW = 5
"""Window of the live controller's run (its first window is uncompressed and not measured)."""

STATIC_OPTIONS: tuple[str, ...] = ("fp16", "powersgd-r4", "adaptive")
"""Advisor options measured by running their plan as a static autocomp plan."""
LIVE = "autocomp (live)"
"""Row of the live adaptive controller."""


@dataclass(frozen=True, slots=True)
class Comparison:
    """One option at one rate: the advisor's step time against the measured one."""

    rate: str
    option: str
    predicted_s: float
    measured_s: float | None
    gated: bool
    """Counts towards the check (the live controller's plan is its own: informational)."""
    measured_plan: str = ""
    error: str | None = None

    @property
    def rel_error(self) -> float | None:
        if self.measured_s is None or self.measured_s <= 0:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def within(self) -> bool:
        rel = self.rel_error
        return rel is not None and abs(rel) <= TOLERANCE

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "option": self.option,
            "predicted_s": self.predicted_s,
            "measured_s": self.measured_s,
            "rel_error": self.rel_error,
            "within_tolerance": self.within,
            "gated": self.gated,
            "measured_plan": self.measured_plan,
            "error": self.error,
        }


def compare(
    rate: str, predicted: dict[str, float], measured: dict[str, dict[str, Any]]
) -> list[Comparison]:
    """Pair each predicted option with its measured run (``measured`` keyed like predicted,
    plus :data:`LIVE` compared with the ``adaptive`` prediction)."""
    rows: list[Comparison] = []
    for option in ("none", *STATIC_OPTIONS, LIVE):
        result = measured.get(option)
        if result is None:
            continue
        key = "adaptive" if option == LIVE else option
        error = result.get("error")
        interval = None if error else result.get("median_interval_s")
        plan = result.get("info", {}).get("plan") or {}
        rows.append(
            Comparison(
                rate=rate,
                option=option,
                predicted_s=predicted[key],
                measured_s=interval,
                gated=option != LIVE,
                measured_plan=plan_summary(plan) if plan else "",
                error=error,
            )
        )
    return rows


def check_line(rows: list[Comparison]) -> tuple[bool, str]:
    gated = [r for r in rows if r.gated]
    failed = [r for r in gated if not r.within]
    worst = max((abs(r.rel_error) for r in gated if r.rel_error is not None), default=None)
    worst_text = "n/a" if worst is None else f"{worst:.0%}"
    if failed:
        names = ", ".join(f"{r.option}@{r.rate}" for r in failed)
        return False, (
            f"FAIL advisor accuracy: {len(failed)}/{len(gated)} predictions outside "
            f"+-{TOLERANCE:.0%} ({names}); worst {worst_text}"
        )
    return True, (
        f"PASS advisor accuracy: all {len(gated)} predictions within +-{TOLERANCE:.0%} of the "
        f"measured step (worst {worst_text})"
    )


def table_lines(rows: list[Comparison], *, markdown: bool = False) -> list[str]:
    columns = ("rate", "option", "predicted s/step", "measured s/step", "error", "plan run")
    body = []
    for r in rows:
        rel = r.rel_error
        body.append(
            [
                r.rate,
                r.option,
                f"{r.predicted_s:.3f}",
                "FAILED" if r.measured_s is None else f"{r.measured_s:.3f}",
                "-" if rel is None else f"{rel:+.0%}" + ("" if r.gated else " (info)"),
                r.measured_plan or "-",
            ]
        )
    if markdown:
        out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        out += ["| " + " | ".join(row) + " |" for row in body]
        return out
    widths = [max(len(c), *(len(row[i]) for row in body)) for i, c in enumerate(columns)]
    out = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in body]
    return out


# ---- the three phases ------------------------------------------------------------------------


def profile_workload(
    network: Network,
    root: Path,
    code_dir: Path,
    steps: int,
    threads: int,
    compressor_budget_s: float = COMPRESSOR_BUDGET_S,
) -> Path:
    """Run ``autocomp-advisor profile`` on the LM script, one rank per host; the profile path."""
    network.set_rate(None)
    out = root / "profile.json"
    script = code_dir / "autocomp_bench" / "lm_script.py"
    argv = [
        sys.executable,
        "-m",
        "autocomp.advisor",
        "profile",
        str(script),
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--compressor-budget",
        str(compressor_budget_s),
        "--",
        "--threads",
        str(threads),
    ]
    port = 29400
    extra = {
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": worker_pythonpath(code_dir),
    }
    procs, logs = [], []
    started = time.monotonic()
    try:
        for host in range(WORLD_SIZE):
            log = open(root / f"profile-rank{host}.log", "w", encoding="utf-8")  # noqa: SIM115
            logs.append(log)
            env = {**network.env(host, port), **extra}
            procs.append(
                network.popen(host, argv, env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
            )
        while True:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                break
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed or time.monotonic() - started > PROFILE_TIMEOUT_S:
                why = (
                    ", ".join(f"rank {r} exited with {c}" for r, c in failed)
                    or f"timed out after {PROFILE_TIMEOUT_S:.0f} s"
                )
                log = tail(root / "profile-rank0.log", 25)
                raise RuntimeError(f"profiling failed: {why}\n{log}")
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for log in logs:
            log.close()
    if not out.exists():
        raise RuntimeError(f"profiling wrote no {out}")
    return out


def predict(profile_path: Path, rate_mbit: float) -> tuple[dict[str, float], dict[str, dict]]:
    """Predicted step per option and each option's per-layer plan at this rate, 2 ranks."""
    from autocomp.advisor.profile import Profile
    from autocomp.advisor.whatif import TCP_ETHERNET_EFFICIENCY, Scenario, WhatIfModel

    profile = Profile.load(profile_path)
    if profile.link is None:
        raise RuntimeError(f"{profile_path} has no link measurement (partial profile)")
    model = WhatIfModel(profile)
    scenario = Scenario(
        bandwidth_bytes_per_s=rate_mbit * 1e6 / 8,
        latency_s=profile.link.latency_s,
        world_size=WORLD_SIZE,
        payload_efficiency=TCP_ETHERNET_EFFICIENCY,  # recommend's default: tbf counts frames
    )
    evaluation = model.evaluate(scenario)
    steps = {r.key: r.step_s for r in evaluation.results}
    plans = {r.key: dict(r.plan) for r in evaluation.results}
    return steps, plans


def measure(
    runner: Runner,
    rate: Rate,
    plans: dict[str, dict],
    *,
    steps: int | None = None,
    warmup_steps: int | None = None,
    threads: int = 1,
    rows: tuple[str, ...] = ("none", *STATIC_OPTIONS, LIVE),
) -> dict[str, dict[str, Any]]:
    """Run plain DDP, the advisor's plans as static plans and the live controller at one rate
    (``steps`` and ``warmup_steps``, when given, replace the rate's default schedule)."""
    from autocomp.advisor.planout import escape_glob

    warmup, measured = default_schedule(rate.mbit, quick=False)
    if steps is not None:
        measured = steps
    if warmup_steps is not None:
        warmup = warmup_steps
    # (row, worker config, untimed steps, share of a full gradient sent per step)
    runs: list[tuple[str, dict[str, Any], int, float]] = [
        ("none", {"method": "allreduce"}, warmup, 1.0)
    ]
    for option in STATIC_OPTIONS:
        plan = {escape_glob(name): spec for name, spec in plans[option].items()}
        share = 0.5 if option == "fp16" else 0.1
        runs.append((option, {"method": "static", "plan": plan}, warmup, share))
    runs.append((LIVE, {"method": "autocomp", "window": LIVE_WINDOW}, LIVE_WINDOW, 0.2))
    out: dict[str, dict[str, Any]] = {}
    for option, extra, warm, share in runs:
        if option not in rows:
            continue
        # One step more than measured: the median is over forward-to-forward intervals.
        total = warm + measured + 1
        first = warm if option == LIVE else 0  # the live run's first window is uncompressed
        gradients = first + (total - first) * share
        estimate = estimate_run_seconds(total, gradients, rate.mbit)
        timeout = 3 * estimate_run_seconds(total, total, rate.mbit) + 240
        cfg = {
            "rate": rate.label,
            "rate_mbit": rate.mbit,
            "total_steps": total,
            "warmup_steps": warm,
            "window": LIVE_WINDOW,
            "seed": SEED,
            "threads": threads,
            **extra,
        }
        print(f"   {option:<16} {total} steps (about {estimate:.0f} s) ...", end="", flush=True)
        result = runner.run(f"{rate.label}-{option.split()[0]}", cfg, timeout)
        out[option] = result
        if "error" in result:
            print(f" FAILED: {result['error']}", flush=True)
        else:
            print(
                f" median {result['median_interval_s']:.3f} s/step, "
                f"{result['bytes_per_step'] / MB:.2f} MB/step",
                flush=True,
            )
    return out


# ---- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autocomp-bench advisor",
        description="Profile the link benchmark's LM with autocomp-advisor, predict its step "
        "time at shaped rates, and measure it there: predicted vs measured per option.",
    )
    parser.add_argument("--rates", default=DEFAULT_RATES, help="default: %(default)s")
    parser.add_argument(
        "--profile-steps", type=int, default=PROFILE_STEPS, help="default: %(default)s"
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="measured steps per run (default: by rate, as autocomp-bench link)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--markdown", type=Path, default=None, help="write a markdown report")
    return parser


def render_markdown(document: dict[str, Any]) -> str:
    rows = [Comparison(**_fields(row)) for row in document["rows"]]
    lines = [
        f"Command: `{document['command']}` (autocomp code {document['code_digest']}, "
        f"{document['runtime_s'] / 60:.0f} min).",
        "",
        f"Profile: {document['profile_summary']}",
        "",
        *table_lines(rows, markdown=True),
        "",
        document["check"],
        "",
    ]
    return "\n".join(lines)


def _fields(row: dict[str, Any]) -> dict[str, Any]:
    names = ("rate", "option", "predicted_s", "measured_s", "gated", "measured_plan", "error")
    return {name: row[name] for name in names}


def _profile_summary(path: Path) -> str:
    from autocomp.advisor.profile import Profile

    profile = Profile.load(path)
    model = profile.model(None)
    timing = model.timing
    link = profile.link
    link_text = (
        "no link"
        if link is None
        else f"veth unshaped {link.bandwidth_bytes_per_s * 8 / 1e9:.2f} Gbit/s, "
        f"{link.latency_s * 1e6:.0f} us/hop"
    )
    return (
        f"{model.total_bytes / 1e6:.1f} MB of gradients in {len(model.buckets)} buckets, "
        f"step {timing.step_s:.3f} s (compute only {timing.compute_step_s:.3f} s), "
        f"backward {timing.backward_s:.3f} s, hideable {timing.hideable_s:.3f} s; {link_text}; "
        f"{len(profile.compressors)} compressor measurements"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.profile_steps < 3:
        parser.error("--profile-steps must be >= 3")
    if args.steps is not None and args.steps < 2:
        parser.error("--steps must be >= 2")
    try:
        rates = parse_rates(args.rates)
    except ValueError as err:
        parser.error(str(err))
    if any(rate.mbit is None for rate in rates):
        parser.error("--rates: every rate must be shaped (the prediction needs a bandwidth)")
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    reason = shaped_link_unavailable_reason()
    if reason is not None:
        print(f"autocomp-bench advisor needs the shaped link: {reason}", file=sys.stderr)
        return 2
    exit_on_sigterm()
    command = shlex.join(["autocomp-bench", "advisor", *argv])
    print(f"advisor accuracy benchmark: {command}", flush=True)
    started = time.monotonic()
    rows: list[Comparison] = []
    document: dict[str, Any] = {"benchmark": "autocomp_bench.advisor_accuracy", "command": command}
    with tempfile.TemporaryDirectory(prefix="autocomp-advisor-acc-") as tmp:
        root = Path(tmp)
        code_dir, digest = snapshot_code(root)
        document["code_digest"] = digest
        with ShapedLink(ShapedLink.Config(hosts=WORLD_SIZE, rate_mbit=None)) as link:
            network = ShapedNetwork(link)
            runner = Runner(network, root, Runner.Config(code_dir=code_dir))
            print(f"1. profiling {args.profile_steps} steps on the unshaped veth ...", flush=True)
            profile_path = profile_workload(
                network, root, code_dir, args.profile_steps, args.threads
            )
            document["profile"] = json.loads(profile_path.read_text(encoding="utf-8"))
            document["profile_summary"] = _profile_summary(profile_path)
            print(f"   {document['profile_summary']}", flush=True)
            for rate in rates:
                assert rate.mbit is not None
                predicted, plans = predict(profile_path, rate.mbit)
                print(
                    f"2. {rate.label}: predicted "
                    + ", ".join(f"{k} {v:.3f} s" for k, v in predicted.items()),
                    flush=True,
                )
                network.set_rate(rate.mbit)
                print(f"3. {rate.label}: measuring", flush=True)
                measured = measure(runner, rate, plans, steps=args.steps, threads=args.threads)
                document.setdefault("measured", {})[rate.label] = measured
                document.setdefault("predicted", {})[rate.label] = predicted
                document.setdefault("plans", {})[rate.label] = {
                    k: plan_summary(v) for k, v in plans.items()
                }
                rows += compare(rate.label, predicted, measured)
    passed, line = check_line(rows)
    document["runtime_s"] = time.monotonic() - started
    document["rows"] = [row.to_dict() for row in rows]
    document["check"] = line
    document["passed"] = passed
    print()
    print("\n".join(table_lines(rows)))
    print(line, flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    if args.markdown is not None:
        args.markdown.write_text(render_markdown(document), encoding="utf-8")
        print(f"wrote {args.markdown}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
