"""Tier 1: pure unit, no processes.

Covers ``autocomp.policy.optimizer`` (multiple-choice knapsack over a discretized budget):
exact agreement with brute force on small random instances whose times are whole budget
units (hypothesis), including every layer's runner-up (the best plan with that layer forced
to another option); on arbitrary float times, the solution always respects the budget and its
error lies between the brute-force optimum at the budget and at the budget minus one unit per
layer (the documented rounding loss); the infeasible fallback (fastest option per layer,
``feasible=False``); 'none' (zero error) chosen whenever it fits everywhere; zero, negative and
infinite budgets; deterministic tie-breaking; input validation; and speed at realistic size.
"""

from __future__ import annotations

import itertools
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autocomp.policy.optimizer import (
    METHOD_KNAPSACK,
    METHOD_LEAST_ERROR,
    METHOD_MIN_TIME,
    BudgetOptimizer,
    LayerOption,
)

Instance = list[list[LayerOption]]


def _brute(layers: Instance, budget: float, forced: tuple[int, int] | None = None) -> float:
    """Least total error within ``budget`` by enumeration (inf if nothing fits)."""
    best = math.inf
    for combo in itertools.product(*(range(len(options)) for options in layers)):
        if forced is not None and combo[forced[0]] != forced[1]:
            continue
        seconds = math.fsum(layers[layer][o].seconds for layer, o in enumerate(combo))
        if seconds <= budget:
            best = min(best, math.fsum(layers[layer][o].error for layer, o in enumerate(combo)))
    return best


def _option(key: str, seconds: float, error: float) -> LayerOption:
    return LayerOption(key, seconds, error, wire_bytes=int(seconds * 1000))


@st.composite
def integer_instances(draw: st.DrawFn) -> tuple[Instance, int]:
    """Times in whole units; budget = resolution, so one unit is one second: no rounding."""
    count = draw(st.integers(1, 4))
    layers = []
    for layer in range(count):
        options = draw(
            st.lists(st.tuples(st.integers(0, 12), st.integers(0, 50)), min_size=1, max_size=4)
        )
        layers.append([_option(f"l{layer}o{o}", s, float(e)) for o, (s, e) in enumerate(options)])
    return layers, draw(st.integers(1, 40))


@st.composite
def float_instances(draw: st.DrawFn) -> tuple[Instance, float]:
    count = draw(st.integers(1, 5))
    times = st.floats(0.0, 2.0, allow_nan=False, allow_infinity=False)
    errors = st.floats(0.0, 1e3, allow_nan=False, allow_infinity=False)
    layers = []
    for layer in range(count):
        options = draw(st.lists(st.tuples(times, errors), min_size=1, max_size=4))
        layers.append([_option(f"l{layer}o{o}", s, e) for o, (s, e) in enumerate(options)])
    return layers, draw(st.floats(0.01, 8.0))


@settings(max_examples=300, deadline=None)
@given(integer_instances())
def test_matches_brute_force_when_times_are_whole_units(case: tuple[Instance, int]) -> None:
    layers, budget = case
    solution = BudgetOptimizer(BudgetOptimizer.Config(resolution=budget)).solve(layers, budget)
    optimum = _brute(layers, budget)
    assert solution.feasible == math.isfinite(optimum)
    chosen = [layers[layer][c.index] for layer, c in enumerate(solution.choices)]
    assert [c.option for c in solution.choices] == chosen
    assert solution.total_seconds == pytest.approx(math.fsum(o.seconds for o in chosen))
    assert solution.total_error == pytest.approx(math.fsum(o.error for o in chosen))
    if not solution.feasible:
        # Per layer: the least-error option among those within time_tolerance of its fastest.
        assert solution.method == METHOD_MIN_TIME
        tolerance = 1.0 + BudgetOptimizer.Config().time_tolerance
        for option, options in zip(chosen, layers, strict=True):
            fastest = min(x.seconds for x in options)
            near = [x for x in options if x.seconds <= fastest * tolerance]
            assert option in near
            assert option.error == min(x.error for x in near)
        return
    assert solution.total_seconds <= budget
    assert solution.total_error == pytest.approx(optimum)
    if solution.method != METHOD_KNAPSACK:
        return
    for layer, choice in enumerate(solution.choices):
        alternatives = {
            o: _brute(layers, budget, forced=(layer, o))
            for o in range(len(layers[layer]))
            if o != choice.index
        }
        best = min(alternatives.values(), default=math.inf)
        if not math.isfinite(best):
            assert choice.runner_up is None
            continue
        assert choice.runner_up is not None
        assert choice.runner_up_total_error == pytest.approx(best)
        runner = layers[layer].index(choice.runner_up)
        assert alternatives[runner] == pytest.approx(best)


def _brute_capped(layers: Instance, budget: float, caps: list[tuple[int, float]]) -> float:
    """Least total error with every running total within its cap (inf if nothing fits)."""
    best = math.inf
    for combo in itertools.product(*(range(len(options)) for options in layers)):
        times = [layers[layer][o].seconds for layer, o in enumerate(combo)]
        if sum(times) > budget or any(sum(times[:count]) > cap for count, cap in caps):
            continue
        best = min(best, math.fsum(layers[layer][o].error for layer, o in enumerate(combo)))
    return best


@settings(max_examples=300, deadline=None)
@given(integer_instances(), st.data())
def test_caps_on_running_totals_match_brute_force(
    case: tuple[Instance, int], data: st.DataObject
) -> None:
    """Running-total caps (the engine's per-bucket exposure bounds): exact with whole units."""
    layers, budget = case
    counts = data.draw(st.sets(st.integers(1, len(layers)), max_size=len(layers)))
    caps = [(count, float(data.draw(st.integers(-1, budget)))) for count in sorted(counts)]
    solver = BudgetOptimizer(BudgetOptimizer.Config(resolution=budget))
    solution = solver.solve(layers, budget, caps)
    optimum = _brute_capped(layers, budget, caps)
    assert solution.feasible == math.isfinite(optimum)
    if not solution.feasible:
        return
    times = [c.option.seconds for c in solution.choices]
    assert sum(times) <= budget
    assert all(sum(times[:count]) <= cap for count, cap in caps)
    assert solution.total_error == pytest.approx(optimum)


def test_caps_are_validated() -> None:
    layers = [[_option("a", 1, 0)], [_option("b", 1, 0)]]
    solver = BudgetOptimizer()
    for caps in ([(0, 1.0)], [(3, 1.0)], [(2, 1.0), (1, 1.0)], [(1, 1.0), (1, 2.0)]):
        with pytest.raises(ValueError, match="caps"):
            solver.solve(layers, 5.0, caps)
    with pytest.raises(ValueError, match="NaN"):
        solver.solve(layers, 5.0, [(1, math.nan)])


@settings(max_examples=300, deadline=None)
@given(float_instances(), st.sampled_from([7, 50, 400]))
def test_float_times_respect_budget_within_rounding_loss(
    case: tuple[Instance, float], resolution: int
) -> None:
    layers, budget = case
    solution = BudgetOptimizer(BudgetOptimizer.Config(resolution=resolution)).solve(layers, budget)
    optimum = _brute(layers, budget)
    assert solution.feasible == math.isfinite(optimum)
    if not solution.feasible:
        return
    assert solution.total_seconds <= budget * (1 + 1e-12)
    assert solution.total_error >= optimum - 1e-9 * max(1.0, optimum)
    # Rounding up costs at most one unit per layer: anything fitting in the shrunk budget
    # is within reach of the program.
    shrunk = _brute(layers, budget - len(layers) * budget / resolution)
    assert solution.total_error <= shrunk + 1e-9 * max(1.0, shrunk)


def test_infeasible_returns_fastest_per_layer() -> None:
    layers = [
        [_option("none", 5.0, 0.0), _option("fast", 2.0, 3.0), _option("mid", 3.0, 1.0)],
        [_option("none", 4.0, 0.0), _option("fast", 1.5, 9.0)],
    ]
    solution = BudgetOptimizer().solve(layers, budget_seconds=3.0)
    assert not solution.feasible
    assert solution.method == METHOD_MIN_TIME
    assert [c.option.key for c in solution.choices] == ["fast", "fast"]
    assert solution.total_seconds == pytest.approx(3.5)
    assert solution.total_error == pytest.approx(12.0)
    # Runner-up when infeasible: the next fastest option.
    assert [c.runner_up.key for c in solution.choices if c.runner_up] == ["mid", "none"]


def test_none_chosen_when_it_fits_everywhere() -> None:
    layers = [
        [_option("none", 0.2, 0.0), _option("fp16", 0.1, 1e-6), _option("topk", 0.01, 0.5)]
        for _ in range(10)
    ]
    solution = BudgetOptimizer().solve(layers, budget_seconds=2.0)  # exactly fits
    assert solution.feasible
    assert solution.method == METHOD_LEAST_ERROR
    assert all(c.option.key == "none" for c in solution.choices)
    assert solution.total_error == 0.0
    assert all(c.runner_up is not None and c.runner_up.key == "fp16" for c in solution.choices)


def test_budget_forces_a_mix() -> None:
    # Two layers of 1 s uncompressed, budget 1.5 s: compress the one that costs less error.
    layers = [
        [_option("none", 1.0, 0.0), _option("psgd", 0.1, 4.0)],
        [_option("none", 1.0, 0.0), _option("psgd", 0.1, 1.0)],
    ]
    solution = BudgetOptimizer().solve(layers, budget_seconds=1.5)
    assert solution.method == METHOD_KNAPSACK
    assert [c.option.key for c in solution.choices] == ["none", "psgd"]
    assert solution.total_seconds <= 1.5
    first = solution.choices[0]
    assert first.runner_up is not None and first.runner_up.key == "psgd"
    assert first.runner_up_total_error == pytest.approx(4.0)  # the other layer goes back to none


def test_infinite_budget_takes_least_error() -> None:
    layers = [[_option("a", 9.0, 1.0), _option("b", 1.0, 2.0)]]
    solution = BudgetOptimizer().solve(layers, math.inf)
    assert solution.feasible and solution.choices[0].option.key == "a"


def test_zero_budget_takes_free_options_only() -> None:
    layers = [
        [_option("slow", 1.0, 0.0), _option("free-bad", 0.0, 5.0), _option("free", 0.0, 2.0)],
        [_option("free", 0.0, 1.0)],
    ]
    solution = BudgetOptimizer().solve(layers, 0.0)
    assert solution.feasible
    assert [c.option.key for c in solution.choices] == ["free", "free"]
    assert not BudgetOptimizer().solve([[_option("slow", 1.0, 0.0)]], 0.0).feasible


def test_negative_budget_is_infeasible() -> None:
    solution = BudgetOptimizer().solve([[_option("free", 0.0, 0.0)]], -1.0)
    assert not solution.feasible
    assert solution.choices[0].option.key == "free"


def test_no_layers() -> None:
    solution = BudgetOptimizer().solve([], 1.0)
    assert solution.feasible and solution.choices == () and solution.total_seconds == 0.0


def test_ties_are_deterministic() -> None:
    layers = [[_option("x", 0.5, 1.0), _option("y", 0.5, 1.0), _option("z", 0.2, 1.0)]] * 3
    first = BudgetOptimizer().solve(layers, 1.0)
    again = BudgetOptimizer().solve(layers, 1.0)
    assert first == again
    # Equal error: the faster option wins the tie.
    assert all(c.option.key == "z" for c in first.choices)


def test_validation() -> None:
    with pytest.raises(ValueError, match="layer 1 has no options"):
        BudgetOptimizer().solve([[_option("a", 1.0, 0.0)], []], 1.0)
    with pytest.raises(ValueError, match="seconds must be a finite number >= 0"):
        LayerOption("a", -1.0, 0.0, 0)
    with pytest.raises(ValueError, match="error must be a finite number >= 0"):
        LayerOption("a", 1.0, math.nan, 0)
    with pytest.raises(ValueError, match="NaN"):
        BudgetOptimizer().solve([[_option("a", 1.0, 0.0)]], math.nan)
    with pytest.raises(ValueError, match="resolution"):
        BudgetOptimizer(BudgetOptimizer.Config(resolution=0))


def test_realistic_size_is_fast() -> None:
    layers = [
        [
            _option(f"o{o}", 0.001 * (8 - o) * (1 + layer % 7), float(o * o) * (1 + layer % 5))
            for o in range(8)
        ]
        for layer in range(300)
    ]
    budget = 0.5 * math.fsum(o[0].seconds for o in layers)
    start = time.perf_counter()
    solution = BudgetOptimizer().solve(layers, budget)
    elapsed = time.perf_counter() - start
    assert solution.feasible and solution.method == METHOD_KNAPSACK
    assert solution.total_seconds <= budget
    assert elapsed < 10.0, f"300 layers x 8 options took {elapsed:.2f} s"
