"""Tier 1: the overhead benchmark's arithmetic (pure unit, no processes).

The benchmark itself (``autocomp-bench overhead``) spawns ranks and takes minutes; its numbers
live in docs/benchmarks.md. Here: per-round ratios, their median over rounds, the share of
the step the window loop accounts for itself, and the one-off opening reported apart.
"""

from __future__ import annotations

import pytest

from autocomp_bench.overhead import MODES, summarize


def _round(
    ddp: float,
    static: float,
    adaptive: float,
    boundary_s: float,
    opening_s: float = 0.0,
    torch_hook: float | None = None,
) -> dict:
    torch_hook = ddp if torch_hook is None else torch_hook
    times = {
        "ddp": [ddp] * 3,
        "torch_hook": [torch_hook] * 3,
        "static": [static] * 3,
        "adaptive": [adaptive] * 3,
    }
    return {"times": times, "boundary_s": boundary_s, "opening_s": opening_s}


def test_summary_takes_ratios_per_round_and_their_median() -> None:
    rounds = [
        _round(0.100, 0.110, 0.111, 0.02, 0.15, torch_hook=0.104),  # +10% hook, +0.9% profiler
        _round(0.200, 0.210, 0.250, 0.04, 0.30),  # a noisy round: +19% profiler
        _round(0.100, 0.105, 0.105, 0.00, 0.20),
    ]
    result = summarize(rounds, steps=10)
    assert set(result["median_step_s"]) == set(MODES)
    assert result["profiling_overhead"]["median"] == pytest.approx(0.111 / 0.110 - 1)
    assert result["profiling_overhead"]["max"] == pytest.approx(0.250 / 0.210 - 1)
    assert result["hook_overhead"]["min"] == pytest.approx(0.05)
    # The first round's 10% splits into the Python hook mechanism's 4% (PyTorch's own hook)
    # and autocomp's own 5.8% on top of it.
    assert result["rounds"][0]["python_hook_overhead"] == pytest.approx(0.04)
    assert result["rounds"][0]["own_hook_overhead"] == pytest.approx(0.110 / 0.104 - 1)
    # 0.02 s of boundaries over 10 steps of 0.111 s: 1.8% of the step.
    assert result["rounds"][0]["boundary_share"] == pytest.approx(0.002 / 0.111)
    assert result["steps_per_mode"] == {mode: 9 for mode in MODES}
    assert set(MODES) == {"ddp", "torch_hook", "static", "adaptive"}
    # The opening is once per run, reported apart from the recurring boundaries.
    assert result["opening_s"] == {"median": 0.20, "min": 0.15, "max": 0.30}


def test_an_unknown_task_is_a_usage_error() -> None:
    from autocomp_bench.overhead import main

    with pytest.raises(SystemExit) as err:
        main(["--task", "no-such-task"])
    assert err.value.code == 2
