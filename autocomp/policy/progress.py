"""Progress per second: what a plan's step time and its compression error are worth together.

A step of a plan delivers ``1 - a x E`` of an uncompressed step's training progress, ``E``
being its summed option error (squared relative error x layer weight x family weight) and
``a`` the policy's ``error_cost`` over the layers' total weight; per second that is
``(1 - a E) / step``. The plan search (:mod:`autocomp.policy.search`) first takes the least
error within the time slack of the fastest plan; :func:`progress_ascent` then moves it
towards more accurate options while this rate rises, and the engine's dwell locks give way
when they cost more than ``dwell_max_loss`` of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from autocomp.exposure import Timeline
from autocomp.policy.optimizer import LayerOption
from autocomp.policy.types import NONE_SPEC

__all__ = ["PlanProblem", "progress_ascent", "progress_rate", "rate"]


class PlanProblem(Protocol):
    """The search's view of the pending layers: their options, and the exact timeline."""

    @property
    def pending(self) -> Sequence[_PendingOptions]: ...

    def timeline(self, chosen: Sequence[LayerOption]) -> Timeline: ...

    def moves(self, chosen: Sequence[LayerOption]) -> _PlanMoves: ...


class _Trial(Protocol):
    """A priced move (``autocomp.policy.plan_load.Trial``)."""

    @property
    def timeline(self) -> Timeline: ...


class _PlanMoves(Protocol):
    """A plan priced for single-layer moves (``autocomp.policy.plan_load.PlanMoves``)."""

    chosen: list[LayerOption]
    timeline: Timeline
    error: float

    def trial(self, index: int, option: LayerOption) -> _Trial: ...

    def move(self, index: int, option: LayerOption, tried: _Trial) -> None: ...

    def error_after(self, index: int, option: LayerOption) -> float: ...

    def compressed_after(self, index: int, option: LayerOption) -> int: ...


class _PendingOptions(Protocol):
    @property
    def options(self) -> list[LayerOption]: ...


def progress_rate(step: float, error: float, progress_per_error: float) -> float:
    """Predicted progress per second, in uncompressed steps' worth per second: a step of
    ``step`` seconds delivers ``1 - progress_per_error x error`` (summed option error) of an
    uncompressed step's progress."""
    progress = max(0.0, 1.0 - progress_per_error * error)
    return progress / step if step > 0 else 0.0


def rate(
    problem: PlanProblem, chosen: Sequence[LayerOption], compute: float, per_error: float
) -> float:
    """:func:`progress_rate` of ``chosen`` on the exact exposure model."""
    step = compute + problem.timeline(chosen).added_s
    return progress_rate(step, math.fsum(o.error for o in chosen), per_error)


def _separable_plan(
    problem: PlanProblem, start: Sequence[LayerOption], compute: float, per_error: float
) -> list[LayerOption]:
    """Dinkelbach's iteration for the ratio (1 - a E) / (compute + sum of seconds), every
    layer's time counted as exposed (the slow-link case): at the ratio q of the last plan,
    each layer takes the option least in ``a x error + q x seconds``. It jumps across the
    frontier where single-layer moves from the slack plan would stall on overlap effects."""
    chosen = list(start)
    a = per_error
    for _ in range(8):
        total = compute + math.fsum(o.seconds for o in chosen)
        if total <= 0:
            return chosen
        q = max(1.0 - a * math.fsum(o.error for o in chosen), 0.0) / total
        step = [
            min(
                (o for o in item.options if o.error <= origin.error),
                key=lambda o: (a * o.error + q * o.seconds, o.seconds, o.key),
            )
            for item, origin in zip(problem.pending, start, strict=True)
        ]
        if [o.key for o in step] == [o.key for o in chosen] or all(
            o.key == NONE_SPEC for o in step
        ):
            break
        chosen = step
    return chosen


def progress_ascent(
    problem: PlanProblem,
    start: Sequence[LayerOption],
    compute: float,
    per_error: float,
    passes: int = 3,
) -> list[LayerOption]:
    """The compressed plan that learns most per second from ``start`` towards more accurate
    options: the better of ``start`` and the separable plan, each improved by single-layer
    moves to a lower-error option on the exact model while a move raises the predicted
    rate. The slack rule ranks plans by time first; a slower plan outside the slack still
    learns faster per second when the fast plans' errors cost more progress than the extra
    time (top-1% against PowerSGD on a slow link). Only error-lowering moves are tried: a
    time gain within the slack is below what the predictions can tell (the slack rule's
    premise). The move to all-uncompressed is left to the engine's bar
    (``PolicyEngine._compression_pays``), which holds a plan in use by a margin and says
    why."""
    best = list(start)
    best_rate = rate(problem, best, compute, per_error)
    for origin in (list(start), _separable_plan(problem, start, compute, per_error)):
        plan = problem.moves(origin)
        current = progress_rate(compute + plan.timeline.added_s, plan.error, per_error)
        for _ in range(passes):
            improved = False
            for index, item in enumerate(problem.pending):
                for option in item.options:
                    if option.error >= plan.chosen[index].error:
                        continue
                    if plan.compressed_after(index, option) == 0:
                        continue  # whether compression pays at all is the engine's bar
                    tried = plan.trial(index, option)
                    trial_rate = progress_rate(
                        compute + tried.timeline.added_s, plan.error_after(index, option), per_error
                    )
                    if trial_rate > current * (1 + 1e-6):
                        plan.move(index, option, tried)
                        current, improved = trial_rate, True
            if not improved:
                break
        if current > best_rate * (1 + 1e-6):
            best, best_rate = list(plan.chosen), current
    return best
