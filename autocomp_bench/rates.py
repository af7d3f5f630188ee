"""The link benchmark's ``rates`` scenario: step time per method at every link rate.

At every rate, four methods train a fresh model of the link benchmark's LM
(``mlp-lm-large``) from the same seed:

* ``allreduce``: plain DDP (default 25 MiB buckets);
* ``fp16``: PyTorch's ``fp16_compress_hook``;
* ``powersgd``: PyTorch's ``powerSGD_hook`` (rank 4, error feedback, warm start,
  ``start_powerSGD_iter=2``) with a single bucket (see :data:`POWERSGD_NOTE`);
* ``autocomp``: ``autocomp.wrap(ddp, target_overlap=0.9, window=W, warmup_steps=0)``.

The step time is measured on rank 0 from the start of the forward to the end of
``optimizer.step()`` (which includes waiting for the gradient communication), with no barrier;
the report gives the median over the measured steps. autocomp's first window runs uncompressed
while it measures the link, so only steps after its first decision count.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
from pathlib import Path
from typing import Any

from autocomp_bench.harness import SEED, Network, Rate, Runner
from autocomp_bench.report import MB, Check, other_share, plain_table, plan_summary
from autocomp_bench.tasks import MLP_LM_LARGE
from autocomp_bench.worker import POWERSGD_START_ITER

logger = logging.getLogger(__name__)

__all__ = ["rate_checks", "rate_rows", "rate_table_lines", "run_rates"]

METHODS: tuple[str, ...] = ("allreduce", "fp16", "powersgd", "autocomp")
PEERS: tuple[str, ...] = ("allreduce", "fp16", "powersgd")
POWERSGD_NOTE = (
    "powersgd runs with ONE DDP bucket (bucket_cap_mb=1000): with several buckets PyTorch's "
    "powerSGD_hook aborts on gloo, because it launches its second all-reduce (of Q) from a "
    "future callback, and the order in which those callbacks fire differs between ranks."
)
CHECK_PEER_FACTOR = 1.05
CHECK_200_SPEEDUP = 3.0
CHECK_UNSHAPED_FACTOR = 1.03

TABLE_COLUMNS = (
    "method",
    "median s/step",
    "speedup vs allreduce",
    "MB/step",
    "final loss",
    "valid loss",
    "steps (measured/total)",
    "other CPU",
)


# ---- schedule --------------------------------------------------------------------------------


def default_schedule(rate_mbit: float | None, quick: bool) -> tuple[int, int]:
    """(warm-up steps, measured steps) for the peers at this rate, sized to the run time.

    Plain all-reduce of the 66 MB gradient takes about 55 s at 10 Mbit/s, 11 s at 50 Mbit/s,
    2.7 s at 200 Mbit/s, so the slow rates get few steps; there the step time is set by the
    link alone and hardly varies from step to step.
    """
    if quick:
        return 2, 4
    if rate_mbit is not None and rate_mbit < 20:
        return 1, 3
    if rate_mbit is not None and rate_mbit < 100:
        return 2, 5
    if rate_mbit is not None and rate_mbit < 500:
        return 5, 10
    return 5, 20


def raw_gradient_bytes() -> int:
    """Bytes of one uncompressed float32 gradient of the benchmark model."""
    context, embed, hidden = MLP_LM_LARGE["context"], MLP_LM_LARGE["embed"], MLP_LM_LARGE["hidden"]
    vocab = 256
    numel = (
        vocab * embed
        + context * embed * hidden
        + hidden
        + hidden * hidden
        + hidden
        + 2 * hidden
        + hidden * vocab
        + vocab
    )
    return 4 * numel


def estimate_run_seconds(
    steps: int,
    full_gradients: float,
    rate_mbit: float | None,
    gradient_bytes: int | None = None,
    compute_s: float = 0.6,
) -> float:
    """Rough wall time of a run of ``steps`` steps that sends ``full_gradients`` raw gradients.

    Defaults describe the LM; the convergence scenario passes the digits CNN's gradient size
    and step compute time.
    """
    seconds = 15.0 + compute_s * steps
    if rate_mbit is not None:
        size = raw_gradient_bytes() if gradient_bytes is None else gradient_bytes
        seconds += full_gradients * size * 8 / (rate_mbit * 1e6) / 0.95
    return seconds


# ---- runs ------------------------------------------------------------------------------------


def run_rates(
    network: Network,
    runner: Runner,
    rates: list[Rate],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for rate in rates:
        network.set_rate(rate.mbit)
        warmup, measured = default_schedule(rate.mbit, args.quick)
        if args.warmup is not None:
            warmup = args.warmup
        if args.steps is not None:
            measured = args.steps
        print(
            f"\n== rate {rate.label}: peers {warmup} warm-up + {measured} measured steps; "
            f"autocomp window {args.window} (uncompressed) + {measured} measured steps",
            flush=True,
        )
        for method in args.methods:
            # Full gradients sent, for the time estimate (autocomp: its uncompressed first
            # window, then a guess) and the timeout (every step uncompressed, with margin).
            if method == "autocomp":
                warm = args.window
                gradients = args.window + measured * 0.1
            elif method == "powersgd":
                warm = max(warmup, POWERSGD_START_ITER + 1)
                gradients = POWERSGD_START_ITER + (warm + measured) * 0.01
            else:
                warm = warmup
                gradients = (warm + measured) * (0.5 if method == "fp16" else 1.0)
            total = warm + measured
            estimate = estimate_run_seconds(total, gradients, rate.mbit)
            timeout = 3 * estimate_run_seconds(total, total, rate.mbit) + 240
            cfg = {
                "method": method,
                "rate": rate.label,
                "rate_mbit": rate.mbit,
                "total_steps": total,
                "warmup_steps": warm,
                "window": args.window,
                "seed": SEED,
                "threads": args.threads,
            }
            print(f"   {method:<10} {total} steps (about {estimate:.0f} s) ...", end="", flush=True)
            result = runner.run(f"{rate.label}-{method}", cfg, timeout)
            result.update(method=method, rate=rate.label, rate_mbit=rate.mbit)
            results.append(result)
            if "error" in result:
                print(f" FAILED: {result['error']}", flush=True)
            else:
                extra = ""
                if method == "autocomp":
                    extra = f", first decision at step {result['info']['first_decision_step']}"
                print(
                    f" median {result['median_step_s']:.3f} s/step, "
                    f"{result['bytes_per_step'] / MB:.2f} MB/step, wall "
                    f"{result['wall_seconds']:.0f} s, other CPU use {other_share(result)}{extra}",
                    flush=True,
                )
        print()
        print("\n".join(rate_table_lines(results, rate.label)), flush=True)
    return results


# ---- tables ----------------------------------------------------------------------------------


def by_method(results: list[dict[str, Any]], rate: str, method: str) -> dict[str, Any] | None:
    for r in results:
        if r["rate"] == rate and r["method"] == method:
            return r
    return None


def succeeded(result: dict[str, Any] | None) -> bool:
    return result is not None and "error" not in result and result.get("median_step_s") is not None


def rate_rows(results: list[dict[str, Any]], rate: str) -> list[list[str]]:
    base = by_method(results, rate, "allreduce")
    rows = []
    for r in results:
        if r["rate"] != rate:
            continue
        if not succeeded(r):
            rows.append([r["method"], "FAILED", "-", "-", "-", "-", r.get("error", ""), "-"])
            continue
        speed = "-"
        if succeeded(base):
            assert base is not None
            speed = f"{base['median_step_s'] / r['median_step_s']:.2f}x"
        measured = r["total_steps"] - r["measure_from"]
        rows.append(
            [
                r["method"],
                f"{r['median_step_s']:.3f}",
                speed,
                f"{r['bytes_per_step'] / MB:.2f}",
                f"{r['final_loss']:.3f}",
                f"{r['valid_loss']:.3f}",
                f"{measured}/{r['total_steps']}",
                other_share(r),
            ]
        )
    return rows


def rate_table_lines(results: list[dict[str, Any]], rate: str) -> list[str]:
    lines = [f"rate {rate}:"]
    lines += plain_table(TABLE_COLUMNS, rate_rows(results, rate))
    auto = by_method(results, rate, "autocomp")
    if succeeded(auto):
        assert auto is not None
        lines += autocomp_detail_lines(auto)
    return lines


def autocomp_detail_lines(auto: dict[str, Any]) -> list[str]:
    info = auto["info"]
    first = info["first_decision_step"]
    first_window = auto["step_times"][:first]
    lines = [
        f"autocomp: first decision at step {first} (steps 0-{first - 1} ran uncompressed while "
        f"it measured the link: median {statistics.median(first_window):.3f} s/step)",
        f"autocomp final plan: {plan_summary(info['plan'])}",
        "autocomp windows:",
    ]
    lines += [f"  {line}" for line in info["window_lines"]]
    for window in info["windows"]:
        predicted = window.get("predicted_overlap")
        lines.append(
            f"    @{window['step']}: measured overlap {window['measured_overlap']:.2f}, "
            f"predicted {'n/a' if predicted is None else f'{predicted:.2f}'}, "
            f"backward {window['backward_seconds'] * 1e3:.0f} ms, hideable "
            f"{window['hideable_seconds'] * 1e3:.0f} ms, comm busy "
            f"{window['comm_busy_seconds'] * 1e3:.0f} ms, compress "
            f"{window['compress_seconds'] * 1e3:.0f} ms, exposed "
            f"{window['exposed_seconds'] * 1e3:.0f} ms"
            + (
                ""
                if window.get("decision") is None
                else f", decision predicted overlap "
                f"{window['decision'].get('predicted_overlap', float('nan')):.2f}"
                f" feasible={window['decision'].get('feasible')}"
            )
        )
    return lines


# ---- checks ----------------------------------------------------------------------------------


def rate_checks(results: list[dict[str, Any]], rates: list[Rate]) -> list[Check]:
    checks = []
    for rate in rates:
        auto = by_method(results, rate.label, "autocomp")
        peers = [r for m in PEERS if succeeded(r := by_method(results, rate.label, m))]
        name = f"{rate.label}: autocomp median <= {CHECK_PEER_FACTOR} x best of the peers"
        if not succeeded(auto) or not peers:
            checks.append(Check(name, None, "autocomp or every peer failed / missing"))
            continue
        assert auto is not None
        best = min(peers, key=lambda r: r["median_step_s"])
        ratio = auto["median_step_s"] / best["median_step_s"]
        missing = [m for m in PEERS if not succeeded(by_method(results, rate.label, m))]
        checks.append(
            Check(
                name,
                ratio <= CHECK_PEER_FACTOR,
                f"autocomp {auto['median_step_s']:.3f} s vs best peer {best['method']} "
                f"{best['median_step_s']:.3f} s = {ratio:.2f}x"
                + (f" (peers missing: {', '.join(missing)})" if missing else ""),
            )
        )
    for rate in rates:
        if rate.mbit is not None and math.isclose(rate.mbit, 200.0):
            checks.append(_speedup_check(results, rate.label))
    for rate in rates:
        if rate.mbit is None:
            checks.append(_unshaped_check(results, rate.label))
    return checks


def _speedup_check(results: list[dict[str, Any]], rate: str) -> Check:
    name = f"{rate}: autocomp >= {CHECK_200_SPEEDUP:g}x faster than allreduce"
    auto, base = by_method(results, rate, "autocomp"), by_method(results, rate, "allreduce")
    if not (succeeded(auto) and succeeded(base)):
        return Check(name, None, "autocomp or allreduce failed / missing")
    assert auto is not None and base is not None
    speedup = base["median_step_s"] / auto["median_step_s"]
    return Check(
        name,
        speedup >= CHECK_200_SPEEDUP,
        f"allreduce {base['median_step_s']:.3f} s / autocomp {auto['median_step_s']:.3f} s = "
        f"{speedup:.2f}x",
    )


def _unshaped_check(results: list[dict[str, Any]], rate: str) -> Check:
    name = f"{rate}: autocomp <= {CHECK_UNSHAPED_FACTOR} x allreduce"
    auto, base = by_method(results, rate, "autocomp"), by_method(results, rate, "allreduce")
    if not (succeeded(auto) and succeeded(base)):
        return Check(name, None, "autocomp or allreduce failed / missing")
    assert auto is not None and base is not None
    ratio = auto["median_step_s"] / base["median_step_s"]
    return Check(
        name,
        ratio <= CHECK_UNSHAPED_FACTOR,
        f"autocomp {auto['median_step_s']:.3f} s / allreduce {base['median_step_s']:.3f} s = "
        f"{ratio:.2f}x",
    )


# ---- plot ------------------------------------------------------------------------------------


def plot_rates(results: list[dict[str, Any]], rates: list[Rate], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shaped = sorted(r.mbit for r in rates if r.mbit is not None)
    unshaped_x = (shaped[-1] * 4.0) if shaped else 1000.0

    def x_of(rate: Rate) -> float:
        return unshaped_x if rate.mbit is None else rate.mbit

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    markers = {"allreduce": "o", "fp16": "s", "powersgd": "^", "autocomp": "D"}
    for method in METHODS:
        points = [
            (x_of(rate), r["median_step_s"])
            for rate in sorted(rates, key=lambda q: q.sort_key)
            if succeeded(r := by_method(results, rate.label, method))
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=markers.get(method, "o"), label=method, linewidth=1.5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ys_all = [r["median_step_s"] for r in results if succeeded(r)]
    if ys_all:
        lo, hi = min(ys_all), max(ys_all)
        yticks = [t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if lo / 1.5 <= t <= hi * 1.5]
        ax.set_yticks(yticks)
        ax.set_yticklabels([f"{t:g}" for t in yticks])
    ticks = [x_of(r) for r in rates]
    ax.set_xticks(ticks)
    ax.set_xticklabels([r.label for r in rates])
    ax.minorticks_off()
    ax.set_xlabel("link rate per direction (tbf-shaped veth)")
    ax.set_ylabel("median step time (s, log)")
    ax.set_title("2 ranks, gloo, MLP LM 16.5M params, batch 64, 1 CPU thread per rank", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
