"""Monte Carlo of the payoff check, before (49fdb36) and after the fifty-second session.

One compressed plan C whose true step is GAIN shorter than the uncompressed one, per-window
lognormal noise SIGMA on each window's median (1.3x on the 16-step baseline windows), and a
planner that always wants C unless the check holds it or measures a baseline. Prints the
share of C's ideal speed-up each version keeps, for 13 windows (a 60 s run of the digits
ViT) and 100, over 400 runs. From the repository root, with .venv active:
  PYTHONPATH=. python docs/benchmarks-matrix-2026-12-01/session-52/paysim.py [SIGMA]"""

import importlib.util
import math
import random
import statistics
import subprocess
import sys
import tempfile

from autocomp.policy.payoff import PayoffCheck as After

OLD = "49fdb36"


def _old_class() -> type:
    source = subprocess.run(
        ["git", "show", f"{OLD}:autocomp/policy/payoff.py"], check=True, capture_output=True
    ).stdout
    with tempfile.NamedTemporaryFile(suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("payoff_before", f.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules["payoff_before"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.PayoffCheck


def run(check_class: type, gain: float, sigma: float, windows: int, seed: int) -> float:
    """Steps per second relative to staying uncompressed."""
    rnd = random.Random(seed)
    check = check_class()
    compressed, uncompressed = ("fp16",), ("none",)
    plan, ran_before, step, steps, seconds = compressed, None, 0, 0, 0.0
    length, window, bandwidth = 50, 0, 7e7
    while window < windows:
        true = 1.0 - gain if plan == compressed else 1.0
        noise = sigma * (1.3 if length < 50 else 1.0)
        median = true * math.exp(rnd.gauss(0.0, noise))
        step += length
        steps += length
        seconds += length * median
        window += 1
        settled, ran_before = plan == ran_before, plan
        if settled and step >= 50:
            check.observe(
                window,
                plan == compressed,
                median,
                bandwidth,
                plan,
                required_gain=1e-8 if plan == compressed else 0.0,
                predicted_gain=0.10 if plan == compressed else None,
            )
        held = check.hold_reason(window, bandwidth) is not None
        plan = uncompressed if held else compressed
        length = check.baseline_window_steps() or 50
    return steps / seconds


def main() -> None:
    sigma = float(sys.argv[1]) if len(sys.argv) > 1 else 0.05
    versions = {"before": _old_class(), "after": After}
    print(f"window noise sigma {sigma:g}; throughput relative to uncompressed (ideal in brackets)")
    for gain in (0.09, 0.06, 0.03, 0.0, -0.05):
        ideal = max(1.0 / (1.0 - gain), 1.0)
        for windows in (13, 100):
            row = []
            for name, cls in versions.items():
                kept = statistics.mean(run(cls, gain, sigma, windows, s) for s in range(400))
                row.append(f"{name} {kept:.4f}")
            print(f"gain {gain:+.2f}, {windows:3d} windows (ideal {ideal:.4f}): " + ", ".join(row))


if __name__ == "__main__":
    main()
