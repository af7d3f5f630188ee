"""``make demo``: autocomp adapting to a slow link, against plain DDP, in one run.

Two gloo ranks train a 16.5M-parameter byte-level LM on the Python standard library's source.
As root (with iproute2), each rank runs in its own network namespace and the link between
them is rate-limited for real with ``tc tbf`` (200 Mbit/s by default); otherwise both ranks
share loopback, which is a fast link, and the demo says so. The same training runs twice:
plain DDP all-reduce, then ``autocomp.wrap(ddp, target_overlap=0.9)``. While autocomp runs,
each window's line shows the bandwidth it measured, the bytes per step, and what it changed
and why; at the end, both runs' median step times and the speedup.

Everything is embedded: no download, no outside service (runs log to ``./autocomp-runs``).
"""

from __future__ import annotations

import argparse
import logging
import secrets
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from autocomp.env import AUTOCOMP_TOKEN
from autocomp.runlog import new_run_id
from autocomp_bench.harness import SEED, LoopbackNetwork, Network, Runner, ShapedNetwork
from autocomp_bench.report import MB
from autocomp_bench.shaped_link import ShapedLink, parse_rate, shaped_link_unavailable_reason
from autocomp_bench.tasks import MLP_LM_LARGE

logger = logging.getLogger(__name__)

GLOO_TIMEOUT_S = 600.0


class _WindowEcho:
    """Prints autocomp's per-window log lines from rank 0's log as they appear."""

    def __init__(self) -> None:
        self._seen = 0

    def __call__(self, run_dir: Path) -> None:
        log = run_dir / "rank0.log"
        if not log.exists():
            return
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        for line in lines[self._seen :]:
            if "autocomp.adaptive" in line and " step " in line:
                print("   " + line.split("autocomp.adaptive: autocomp ", 1)[-1], flush=True)
        self._seen = len(lines)


def _run(
    runner: Runner,
    method: str,
    steps: int,
    warmup: int,
    window: int,
    rate: float | None,
    monitor: Any = None,
    run_dir: Path | None = None,
) -> dict[str, Any]:
    cfg = {
        "method": method,
        "rate": "demo",
        "rate_mbit": rate,
        "total_steps": steps,
        "warmup_steps": warmup,
        "window": window,
        "seed": SEED,
        "threads": 1,
        "autocomp_run_dir": None if run_dir is None else str(run_dir),
    }
    result = runner.run(f"demo-{method}", cfg, timeout_s=GLOO_TIMEOUT_S * 2, monitor=monitor)
    if "error" in result:
        raise SystemExit(f"demo: the {method} run failed: {result['error']}\n{result['log_tail']}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="200mbit", help="shaped link rate (default 200mbit)")
    parser.add_argument("--steps", type=int, default=25, help="autocomp steps (default 25)")
    parser.add_argument("--window", type=int, default=5, help="autocomp window (default 5)")
    parser.add_argument("--baseline-steps", type=int, default=6, help="plain DDP steps (default 6)")
    parser.add_argument("--port", type=int, default=8765, help="dashboard port (default 8765)")
    parser.add_argument("--run-dir", type=Path, default=None, help="where the run log goes")
    args = parser.parse_args(argv)
    try:
        rate = parse_rate(args.rate)
    except ValueError as err:
        parser.error(str(err))
    if args.steps < 2 * args.window or args.window < 1 or args.baseline_steps < 3:
        parser.error("need --window >= 1, --steps >= 2 x window and --baseline-steps >= 3")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    reason = shaped_link_unavailable_reason()
    with ExitStack() as stack:
        network: Network
        if reason is None and rate is not None:
            link = stack.enter_context(ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=rate)))
            network = ShapedNetwork(link)
            where = f"a {args.rate} link (tc tbf between two network namespaces)"
        else:
            network = LoopbackNetwork()
            why = reason or "no rate given"
            where = f"loopback, UNSHAPED ({why}): a fast link, where autocomp should not compress"
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="autocomp-demo-")))
        runner = Runner(network, tmp, Runner.Config(gloo_timeout_s=GLOO_TIMEOUT_S))
        hidden = MLP_LM_LARGE["hidden"]
        print(f"autocomp demo: 2 gloo ranks on {where}")
        print(f"model: byte-level MLP LM (hidden {hidden}), 16.5M parameters, stdlib source text")

        print(f"\n1) plain DDP all-reduce, {args.baseline_steps} steps ...", flush=True)
        plain = _run(runner, "allreduce", args.baseline_steps, 2, args.window, rate)
        print(
            f"   median {plain['median_step_s']:.3f} s/step, "
            f"{plain['bytes_per_step'] / MB:.1f} MB/step"
        )

        print(
            f"\n2) autocomp.wrap(ddp, target_overlap=0.9), window {args.window}, "
            f"{args.steps} steps (a link probe before step 0 decides at once when the link "
            "dominates the step 5x; otherwise the warm-up runs uncompressed while it measures):",
            flush=True,
        )
        run_dir = (args.run_dir or Path("autocomp-runs") / f"demo-{new_run_id()}").resolve()
        url = _start_dashboard(stack, run_dir, args.port)
        auto = _run(
            runner,
            "autocomp",
            args.steps,
            0,
            args.window,
            rate,
            monitor=_WindowEcho(),
            run_dir=run_dir,
        )
        first = auto["info"]["first_decision_step"]
        plan = auto["info"]["plan"]
        compressed = {name: spec for name, spec in plan.items() if spec != "none"}
        print(
            f"   after its first decision (step {first}): median {auto['median_step_s']:.3f} "
            f"s/step, {auto['bytes_per_step'] / MB:.2f} MB/step"
        )
        print(
            "   final plan: "
            + (
                ", ".join(f"{n}={s.split(',')[0]}" for n, s in compressed.items())
                or "everything uncompressed"
            )
        )

        speedup = plain["median_step_s"] / auto["median_step_s"]
        first_window = statistics.median(auto["step_times"][:first]) if first else None
        print(
            f"\nresult: autocomp {speedup:.2f}x the speed of plain all-reduce on this link "
            f"({plain['median_step_s']:.3f} -> {auto['median_step_s']:.3f} s/step)"
        )
        if first_window is not None:
            print(f"        (its first, uncompressed window: {first_window:.3f} s/step)")
        print(f"\nrun log: {run_dir / 'run.db'}")
        if url is not None:
            print(
                "the dashboard stops with the demo; browse this run again with:\n"
                f"  autocomp-sidecar --run-dir {run_dir}"
            )
    return 0


def _start_dashboard(stack: ExitStack, run_dir: Path, port: int) -> str | None:
    """Serve the run's dashboard from this (root-namespace) process.

    Rank 0 runs inside a network namespace, where 127.0.0.1 is not the user's loopback, so the
    demo starts the sidecar itself on the run directory rank 0 writes to.
    """
    try:
        from autocomp.service.sidecar import (
            SidecarError,
            start_sidecar_process,
            stop_sidecar_process,
            wait_until_healthy,
        )
    except ImportError as err:  # the service extra is not installed
        print(f"   (no dashboard: {err})")
        return None
    token = AUTOCOMP_TOKEN.get() or secrets.token_urlsafe(16)
    run_dir.mkdir(parents=True, exist_ok=True)
    process = start_sidecar_process(run_dir, host="127.0.0.1", port=port, token=token)
    stack.callback(stop_sidecar_process, process)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", timeout=30.0, process=process)
    except SidecarError as err:
        print(f"   (the dashboard did not start: {err}; the demo goes on without it)")
        return None
    url = f"http://127.0.0.1:{port}/policy"
    print(f"   dashboard (live per-layer decisions): {url}   overrides token: {token}", flush=True)
    return url


if __name__ == "__main__":
    raise SystemExit(main())
