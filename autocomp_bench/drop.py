"""The link benchmark's ``drop`` scenario: autocomp's recovery when the link slows mid-run.

autocomp alone at 1 Gbit/s; the parent lowers the link to 50 Mbit/s while both ranks wait at
the same step, and the report says how many windows autocomp needs to get back to its new
steady state (see :data:`RECOVERY_DEFINITION`).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from autocomp_bench.harness import SEED, WORLD_SIZE, Network, Runner
from autocomp_bench.rates import estimate_run_seconds, succeeded
from autocomp_bench.report import Check
from autocomp_bench.shaped_link import parse_rate

logger = logging.getLogger(__name__)

__all__ = ["RECOVERY_DEFINITION", "analyze_drop", "drop_check", "drop_lines", "run_drop"]

RECOVERY_FACTOR = 1.2
RECOVERY_STEADY_WINDOWS = 3
RECOVERY_MAX_WINDOWS = 2

RECOVERY_DEFINITION = (
    f"Windows are blocks of W steps from step 0 (window i = steps iW..iW+W-1; autocomp decides "
    f"at each block boundary). Post-drop steady state = median of the per-window median step "
    f"times of the last {RECOVERY_STEADY_WINDOWS} windows. 'Recovered' = the first window, "
    f"counting from the one containing the drop step, whose median step time is within "
    f"{RECOVERY_FACTOR}x of that steady state. 'Windows to recover' = recovered window index - "
    f"index of the window containing the drop (= decisions autocomp made after the drop before "
    f"the recovered window started). Pre-drop steady state = median of all steps in the "
    f"(up to) 3 windows before the drop window, excluding window 0 (uncompressed)."
)


def run_drop(network: Network, runner: Runner, args: argparse.Namespace) -> dict[str, Any]:
    high = parse_rate(args.drop_from)
    low = parse_rate(args.drop_to)
    window = args.window
    drop_step = args.drop_step
    if drop_step is None:
        drop_step = (4 if args.quick else 6) * window + window // 2
    post_windows = args.post_drop_windows or (4 if args.quick else 8)
    drop_window = drop_step // window
    total = (drop_window + 1 + post_windows) * window
    print(
        f"\n== drop: autocomp, {args.drop_from} then {args.drop_to} before step {drop_step} "
        f"(window {window}; the drop falls in window {drop_window}, steps "
        f"{drop_window * window}-{drop_window * window + window - 1}); {total} steps",
        flush=True,
    )
    network.set_rate(high)
    dropped_at: dict[str, float] = {}

    def monitor(run_dir: Path) -> None:
        if "done" in dropped_at:
            return
        if all((run_dir / f"reached-{r}").exists() for r in range(WORLD_SIZE)):
            network.set_rate(low)
            dropped_at["done"] = time.time()
            (run_dir / "dropped").write_text("dropped")
            print(f"   both ranks at step {drop_step}: link set to {args.drop_to}", flush=True)

    cfg = {
        "method": "autocomp",
        "rate": f"{args.drop_from}->{args.drop_to}",
        "rate_mbit": high,
        "total_steps": total,
        "warmup_steps": window,
        "window": window,
        "seed": SEED,
        "threads": args.threads,
        "drop_step": drop_step,
    }
    timeout = 3 * estimate_run_seconds(total, total, low) + 240
    result = runner.run("drop-autocomp", cfg, timeout, monitor=monitor)
    document: dict[str, Any] = {
        "from": args.drop_from,
        "to": args.drop_to,
        "from_mbit": high,
        "to_mbit": low,
        "window": window,
        "drop_step": drop_step,
        "total_steps": total,
        "autocomp": result,
    }
    if "error" in result:
        print(f"   autocomp run FAILED: {result['error']}", flush=True)
        document["check"] = Check("drop: recovers within 2 windows", None, result["error"])
        return document
    if "done" not in dropped_at:
        raise RuntimeError("the drop run finished without reaching the drop step")
    document["analysis"] = analyze_drop(result["step_times"], window, drop_step)
    if not args.no_drop_reference:
        network.set_rate(low)
        warm, measured = 1, 3
        if args.quick:
            warm, measured = 1, 2
        ref_cfg = {
            "method": "allreduce",
            "rate": args.drop_to,
            "rate_mbit": low,
            "total_steps": warm + measured,
            "warmup_steps": warm,
            "window": window,
            "seed": SEED,
            "threads": args.threads,
        }
        print(f"   reference: allreduce at {args.drop_to}, {warm + measured} steps ...", flush=True)
        ref = runner.run("drop-allreduce", ref_cfg, 3 * estimate_run_seconds(4, 4, low) + 240)
        document["reference"] = ref
    document["check"] = drop_check(document)
    print("\n".join(drop_lines(document)), flush=True)
    return document


def analyze_drop(times: list[float], window: int, drop_step: int) -> dict[str, Any]:
    """Per-window medians and the recovery count (see :data:`RECOVERY_DEFINITION`)."""
    n_windows = len(times) // window
    medians = [statistics.median(times[i * window : (i + 1) * window]) for i in range(n_windows)]
    drop_window = drop_step // window
    steady_windows = list(range(n_windows - RECOVERY_STEADY_WINDOWS, n_windows))
    steady_after = statistics.median(medians[i] for i in steady_windows)
    pre_windows = [i for i in range(max(1, drop_window - 3), drop_window)]
    pre_steps = [t for i in pre_windows for t in times[i * window : (i + 1) * window]]
    steady_before = statistics.median(pre_steps) if pre_steps else None
    recovered = None
    for i in range(drop_window, n_windows):
        if medians[i] <= RECOVERY_FACTOR * steady_after:
            recovered = i
            break
    return {
        "window_medians": medians,
        "drop_window": drop_window,
        "steady_before_s": steady_before,
        "steady_before_windows": pre_windows,
        "steady_after_s": steady_after,
        "steady_after_windows": steady_windows,
        "recovered_window": recovered,
        "windows_to_recover": None if recovered is None else recovered - drop_window,
    }


def drop_check(document: dict[str, Any]) -> Check:
    name = f"drop: recovers within {RECOVERY_MAX_WINDOWS} windows"
    analysis = document.get("analysis")
    if analysis is None:
        return Check(name, None, "no analysis")
    k = analysis["windows_to_recover"]
    if k is None:
        return Check(name, False, "never within 1.2x of the final steady state")
    return Check(
        name,
        k <= RECOVERY_MAX_WINDOWS,
        f"recovered in window {analysis['recovered_window']}, {k} window(s) after the drop "
        f"window {analysis['drop_window']}",
    )


def drop_lines(document: dict[str, Any]) -> list[str]:
    result = document["autocomp"]
    lines = [
        f"drop scenario: {document['from']} -> {document['to']} before step "
        f"{document['drop_step']}, window {document['window']}, {document['total_steps']} steps"
    ]
    if "error" in result:
        return [*lines, f"autocomp FAILED: {result['error']}"]
    a = document["analysis"]
    window = document["window"]
    lines.append(
        f"steady step time before the drop: {a['steady_before_s']:.3f} s "
        f"(windows {a['steady_before_windows']})"
    )
    lines.append(
        f"steady step time after recovery: {a['steady_after_s']:.3f} s "
        f"(last {RECOVERY_STEADY_WINDOWS} windows {a['steady_after_windows']})"
    )
    ref = document.get("reference")
    if ref is not None:
        if succeeded(ref):
            lines.append(
                f"reference allreduce at {document['to']}: {ref['median_step_s']:.3f} s/step "
                f"(autocomp post-drop speedup {ref['median_step_s'] / a['steady_after_s']:.2f}x)"
            )
        else:
            lines.append(f"reference allreduce at {document['to']}: FAILED {ref.get('error')}")
    lines.append(
        f"recovered window: {a['recovered_window']} ("
        f"{a['windows_to_recover']} window(s) after the drop window {a['drop_window']})"
    )
    lines.append("per-window median step time (rank 0):")
    for i, median in enumerate(a["window_medians"]):
        mark = ""
        if i == a["drop_window"]:
            mark = f"  <- drop before step {document['drop_step']}"
        elif i == a["recovered_window"]:
            mark = "  <- recovered"
        lines.append(
            f"  window {i:>2} (steps {i * window:>3}-{i * window + window - 1:>3}): "
            f"{median:7.3f} s{mark}"
        )
    lines.append("autocomp window lines (record step = where its new plan takes effect):")
    lines += [f"  {line}" for line in result["info"]["window_lines"]]
    lines.append(document["check"].line())
    return lines
