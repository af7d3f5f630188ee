"""The per-layer budgeted choice: least total compression error within a time budget.

Every layer offers a few options (one per candidate compressor), each with the time it puts
on the step's critical path, the squared error it adds, and its wire bytes. Picking one option
per layer so that the summed error is minimal while the summed time stays within the budget is
a multiple-choice knapsack. It is solved exactly on a discretized budget by dynamic
programming: the budget is cut into ``resolution`` equal units and every option's time is
rounded *up* to whole units, so a plan the program accepts never exceeds the budget as
predicted (at worst it forgoes a plan that would have fitted within one unit per layer).
Cost: O(layers x options x resolution) numpy work.

Before the program runs, the plan of each layer's least-error option is tried as it is: when
it fits (the common case on a fast link, where that plan is 'none' everywhere), it is the
exact optimum and no rounding is involved. When even the fastest option of every layer
exceeds the budget, the fastest options are returned with ``feasible=False``.

Caps. Besides the budget on the total, ``caps`` may bound running totals: ``(count, seconds)``
means the first ``count`` layers together take at most ``seconds``. The policy engine orders
layers by bucket, the last one DDP hands over first, so these are the communication that
must fit behind what is left of the backward once each bucket is ready. In the program a cap
clips the table after its layer (a plan using more is dropped); costs are rounded up and caps
down, so an accepted plan meets every cap as predicted.

For each layer the solver also reports a runner-up, so a decision can say what it beat. From
the uncapped program it is the option the solver would pick for that layer if the chosen one
were unavailable, every other layer re-optimized around it (from forward and backward tables).
Otherwise (least-error plan fits, infeasible, or caps) it is the next least-error option,
respectively the next fastest one, the other layers left as they are.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["BudgetOptimizer", "BudgetSolution", "LayerChoice", "LayerOption"]

METHOD_LEAST_ERROR = "least-error"
"""Every layer's least-error option fits the budget as it is."""
METHOD_KNAPSACK = "knapsack"
"""The dynamic program chose."""
METHOD_FASTEST = "fastest"
"""The fastest plan fits, but rounding to budget units left the program no other plan."""
METHOD_MIN_TIME = "min-time"
"""Infeasible: even the fastest option of every layer exceeds the budget."""


@dataclass(frozen=True, slots=True)
class LayerOption:
    """One way to send one layer: a compressor and what it is predicted to cost."""

    key: str
    """Identifier, normally the canonical compressor spec."""
    seconds: float
    """Predicted time on the step's critical path (communication plus compression)."""
    error: float
    """Predicted squared compression error contributed to the step (>= 0)."""
    wire_bytes: int
    """Bytes this rank hands to the collective."""
    work: float = 0.0
    """The part of ``seconds`` that is compression work on the backward's thread (the rest is
    communication); the exposure model needs them apart, the program only their sum."""
    first_round: float = 0.0
    """Of the communication: a two-round compressor's first round (the next bucket waits)."""
    second_round: float = 0.0
    """Of the communication: its second round (launched by the next bucket's hook call)."""
    final_work: float = 0.0
    """Of the work: the final round's payload, computed once the first round is summed."""
    decode: float = 0.0
    """Of the work: the decode after the last collective."""
    own_collective: str = ""
    """A collective the bucket issues only for options like this one (a payload dtype of its
    own, an all-gather; '' for none): the exact model charges it one full latency per
    bucket that holds such an option (``autocomp.policy.plan_load.GroupLoad``)."""
    own_latency: float = 0.0
    """That collective's full latency (seconds)."""
    own_charged: float = 0.0
    """Of ``seconds``: the share of ``own_latency`` charged to this layer alone (the rest is
    the bucket's, :func:`autocomp.policy.costs.latency_shares`)."""

    def __post_init__(self) -> None:
        names = (
            "seconds",
            "error",
            "work",
            "first_round",
            "second_round",
            "final_work",
            "decode",
            "own_latency",
            "own_charged",
        )
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"option {self.key!r}: {name} must be a finite number >= 0, got {value!r}"
                )
        if self.wire_bytes < 0:
            raise ValueError(f"option {self.key!r}: wire_bytes must be >= 0")


@dataclass(frozen=True, slots=True)
class LayerChoice:
    """The option picked for one layer and the best alternative to it."""

    index: int
    """Index of the chosen option in that layer's option list."""
    option: LayerOption
    """The chosen option."""
    runner_up: LayerOption | None
    """Best alternative (see module docstring), or None if no other option could be used."""
    runner_up_total_error: float | None
    """Plan error had the layer been forced to the runner-up (others re-optimized)."""


@dataclass(frozen=True, slots=True)
class BudgetSolution:
    """One option per layer, with totals as predicted."""

    choices: tuple[LayerChoice, ...]
    """Per layer, in input order."""
    feasible: bool
    """False when even the fastest plan exceeds the budget (then the fastest plan is given)."""
    total_seconds: float
    """Sum of the chosen options' seconds."""
    total_error: float
    """Sum of the chosen options' errors."""
    budget_seconds: float
    """The budget the plan was solved for."""
    method: str
    """How it was found: 'least-error', 'knapsack', 'fastest' or 'min-time' (the constants)."""

    @property
    def indices(self) -> list[int]:
        return [choice.index for choice in self.choices]


def _total_seconds(layers: Sequence[Sequence[LayerOption]], chosen: Sequence[int]) -> float:
    return math.fsum(options[i].seconds for options, i in zip(layers, chosen, strict=True))


def cap_excess(
    layers: Sequence[Sequence[LayerOption]],
    chosen: Sequence[int],
    caps: Sequence[tuple[int, float]],
) -> float:
    """By how much the plan's running totals exceed their caps at most (<= 0: all met)."""
    excess = -math.inf
    for count, seconds in caps:
        excess = max(excess, _total_seconds(layers[:count], chosen[:count]) - seconds)
    return excess


def _least(
    options: Sequence[LayerOption], allowed: Sequence[int], primary: str, secondary: str
) -> int:
    """Index of the allowed option smallest by (primary, secondary, index): deterministic."""
    return min(
        allowed, key=lambda i: (getattr(options[i], primary), getattr(options[i], secondary), i)
    )


def _add_layer(
    previous: np.ndarray, options: Sequence[LayerOption], units: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One step of the knapsack program: the least error per capacity with one more layer.

    ``previous[c]`` is the least error of the layers so far within ``c`` units; returns the
    same with this layer added, and per capacity the option chosen for it (-1: none fits).
    """
    size = len(previous)
    best = np.full(size, np.inf)
    best_arg = np.full(size, -1, dtype=np.int32)
    # Least error (then fewer seconds) first, strict improvement: deterministic ties.
    for o in sorted(range(len(options)), key=lambda i: (options[i].error, options[i].seconds, i)):
        w = int(units[o])
        if w >= size:
            continue
        candidate = previous[: size - w] + options[o].error
        window = best[w:]
        better = candidate < window
        window[better] = candidate[better]
        best_arg[w:][better] = o
    return best, best_arg


class BudgetOptimizer:
    """Multiple-choice knapsack over a discretized time budget (see module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Solver settings."""

        resolution: int = 2000
        """Budget units of the dynamic program; the rounding loss is at most one unit a layer."""
        time_tolerance: float = 0.1
        """Infeasible case: options within this fraction of a layer's fastest count as ties,
        and the least-error one wins (time predictions are not more precise than this)."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or BudgetOptimizer.Config()
        if not isinstance(self.config.resolution, int) or self.config.resolution < 1:
            raise ValueError(f"resolution must be an integer >= 1, got {self.config.resolution!r}")
        if not self.config.time_tolerance >= 0:
            raise ValueError(f"time_tolerance must be >= 0, got {self.config.time_tolerance!r}")

    def solve(
        self,
        layers: Sequence[Sequence[LayerOption]],
        budget_seconds: float,
        caps: Sequence[tuple[int, float]] = (),
    ) -> BudgetSolution:
        """One option per layer minimizing the summed error with summed seconds <= budget and
        every running total within its cap (see the module docstring)."""
        if math.isnan(budget_seconds):
            raise ValueError("budget_seconds is NaN")
        for index, options in enumerate(layers):
            if not options:
                raise ValueError(f"layer {index} has no options")
        counts = [count for count, _ in caps]
        if counts != sorted(set(counts)) or any(not 1 <= c <= len(layers) for c in counts):
            raise ValueError("caps must have distinct counts in 1..len(layers), ascending")
        if any(math.isnan(seconds) for _, seconds in caps):
            raise ValueError("a cap is NaN")
        # The total is one more cap; a running total's own cap never exceeds a later one's.
        bounds = [*caps, (len(layers), budget_seconds)] if layers else []

        def fits(chosen: Sequence[int]) -> bool:
            return cap_excess(layers, chosen, bounds) <= 0 if bounds else budget_seconds >= 0

        least_error = [_least(o, range(len(o)), "error", "seconds") for o in layers]
        if fits(least_error):
            return self._finish(layers, least_error, budget_seconds, METHOD_LEAST_ERROR)
        fastest = [_least(o, range(len(o)), "seconds", "error") for o in layers]
        if not fits(fastest):
            tolerance = 1.0 + self.config.time_tolerance
            near_fastest = [
                _least(
                    o,
                    [i for i in range(len(o)) if o[i].seconds <= o[f].seconds * tolerance],
                    "error",
                    "seconds",
                )
                for o, f in zip(layers, fastest, strict=True)
            ]
            return self._finish(layers, near_fastest, budget_seconds, METHOD_MIN_TIME)
        if budget_seconds == 0:
            # Only free options fit; no units to discretize. Least error among them.
            free = [
                _least(o, [i for i in range(len(o)) if o[i].seconds == 0], "error", "seconds")
                for o in layers
            ]
            return self._finish(layers, free, budget_seconds, METHOD_KNAPSACK)
        if caps:
            return self._capped(layers, budget_seconds, caps, fastest)
        return self._knapsack(layers, budget_seconds, fastest)

    # ---- the dynamic program ---------------------------------------------------------------

    def _units(self, layers: Sequence[Sequence[LayerOption]], unit: float) -> list[np.ndarray]:
        """Each option's seconds in budget units, rounded up (never below the true time)."""
        limit = self.config.resolution + 1
        out = []
        for options in layers:
            costs = []
            for option in options:
                ratio = option.seconds / unit
                units = math.ceil(ratio) if ratio < limit else limit
                if units < limit and units * unit < option.seconds:
                    units += 1  # float division rounded below the true multiple
                costs.append(min(units, limit))
            out.append(np.asarray(costs, dtype=np.int64))
        return out

    def _tables(
        self,
        layers: Sequence[Sequence[LayerOption]],
        units: Sequence[np.ndarray],
        order: Sequence[int],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Best error per capacity over layers taken in ``order``, and the argmin options.

        ``table[k, c]`` is the least error of the first ``k`` layers of ``order`` using at
        most ``c`` units (``table[0] = 0``); ``arg[k, c]`` is the option of layer ``order[k]``.
        """
        size = self.config.resolution + 1
        table = np.zeros((len(order) + 1, size), dtype=np.float64)
        arg = np.full((len(order), size), -1, dtype=np.int32)
        for k, layer in enumerate(order):
            table[k + 1], arg[k] = _add_layer(table[k], layers[layer], units[layer])
        return table, arg

    def _capped(
        self,
        layers: Sequence[Sequence[LayerOption]],
        budget_seconds: float,
        caps: Sequence[tuple[int, float]],
        fastest: Sequence[int],
    ) -> BudgetSolution:
        """The program with running-total caps: tables clipped after each capped layer."""
        resolution = self.config.resolution
        unit = budget_seconds / resolution
        units = self._units(layers, unit)
        # Rounded down (costs are rounded up): a plan within a cap in units is within it.
        limits = {
            count: max(-1, min(resolution, math.floor(seconds / unit))) for count, seconds in caps
        }
        size = resolution + 1
        table = np.zeros(size, dtype=np.float64)
        args = []
        for k, options in enumerate(layers):
            best, best_arg = _add_layer(table, options, units[k])
            limit = limits.get(k + 1)
            if limit is not None:
                # "At most c units" for c above the cap means "at most the cap".
                if limit < 0:
                    best[:] = np.inf
                else:
                    best[limit + 1 :] = best[limit]
            table = best
            args.append(best_arg)
        if not math.isfinite(table[resolution]):
            return self._finish(layers, fastest, budget_seconds, METHOD_FASTEST)
        chosen = [0] * len(layers)
        capacity = resolution
        for k in reversed(range(len(layers))):
            limit = limits.get(k + 1)
            if limit is not None:
                capacity = min(capacity, limit)
            option = int(args[k][capacity])
            chosen[k] = option
            capacity -= int(units[k][option])
        return self._finish(layers, chosen, budget_seconds, METHOD_KNAPSACK)

    def _knapsack(
        self,
        layers: Sequence[Sequence[LayerOption]],
        budget_seconds: float,
        fastest: Sequence[int],
    ) -> BudgetSolution:
        resolution = self.config.resolution
        unit = budget_seconds / resolution
        units = self._units(layers, unit)
        count = len(layers)
        forward, arg = self._tables(layers, units, range(count))
        if not math.isfinite(forward[count, resolution]):
            # Rounding up lost every plan but the fastest, which fits within the budget.
            return self._finish(layers, fastest, budget_seconds, METHOD_FASTEST)
        chosen = [0] * count
        capacity = resolution
        for layer in reversed(range(count)):
            option = int(arg[layer, capacity])
            chosen[layer] = option
            capacity -= int(units[layer][option])
        backward, _ = self._tables(layers, units, range(count - 1, -1, -1))
        runner_ups = []
        for layer, options in enumerate(layers):
            before = forward[layer]
            after = backward[count - 1 - layer]  # layers after this one, at most c units
            best: tuple[float, float, int] | None = None
            for o, option in enumerate(options):
                w = int(units[layer][o])
                if o == chosen[layer] or w > resolution:
                    continue
                rest = before[: resolution - w + 1] + after[resolution - w :: -1]
                total = option.error + float(np.min(rest))
                if math.isfinite(total) and (best is None or (total, option.seconds, o) < best):
                    best = (total, option.seconds, o)
            runner_ups.append(None if best is None else (best[2], best[0]))
        return self._finish(layers, chosen, budget_seconds, METHOD_KNAPSACK, runner_ups)

    # ---- result ----------------------------------------------------------------------------

    def _finish(
        self,
        layers: Sequence[Sequence[LayerOption]],
        chosen: Sequence[int],
        budget_seconds: float,
        method: str,
        runner_ups: Sequence[tuple[int, float] | None] | None = None,
    ) -> BudgetSolution:
        total_error = math.fsum(o[i].error for o, i in zip(layers, chosen, strict=True))
        total_seconds = _total_seconds(layers, chosen)
        choices = []
        for layer, (options, index) in enumerate(zip(layers, chosen, strict=True)):
            others = [i for i in range(len(options)) if i != index]
            runner: int | None
            runner_total: float | None
            if runner_ups is not None:
                found = runner_ups[layer]
                runner, runner_total = (None, None) if found is None else found
            elif not others:
                runner, runner_total = None, None
            else:
                # Outside the program: the next least-error option (when everything fits) or
                # the next fastest one (infeasible), the others left as they are.
                by_time = method in (METHOD_MIN_TIME, METHOD_FASTEST)
                primary, secondary = ("seconds", "error") if by_time else ("error", "seconds")
                runner = _least(options, others, primary, secondary)
                runner_total = total_error - options[index].error + options[runner].error
            choices.append(
                LayerChoice(
                    index=index,
                    option=options[index],
                    runner_up=None if runner is None else options[runner],
                    runner_up_total_error=runner_total,
                )
            )
        feasible = method != METHOD_MIN_TIME
        if not feasible:
            logger.debug(
                "budget %.4g s infeasible: the fastest plan needs %.4g s",
                budget_seconds,
                total_seconds,
            )
        return BudgetSolution(
            choices=tuple(choices),
            feasible=feasible,
            total_seconds=total_seconds,
            total_error=total_error,
            budget_seconds=budget_seconds,
            method=method,
        )
