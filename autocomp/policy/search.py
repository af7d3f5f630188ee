"""The plan search: the least compression error among the plans that train fastest, then
the most progress per second.

What a user buys is training progress per second, so the search starts from time. Let T* be
the predicted step of the fastest plan (every layer on its fastest option), predicted with
the one exposure model (:mod:`autocomp.exposure`): compute-only step, plus the measured step
gap every plan pays (:mod:`autocomp.step_gap`), plus what communication adds. Plans whose
predicted step is within ``time_slack`` of T* are equally fast as far as the predictions can
tell; among them the one with the least total squared error wins. A plan
that meets the overlap target (communication hidden behind the backward, the fast-link case)
is just as acceptable, since hiding is free. Both searches are multiple-choice knapsacks
(:class:`~autocomp.policy.optimizer.BudgetOptimizer`) over the layers in reverse ready order,
one running-total cap per bucket group; the caps are a relaxation (a group's constraint also
depends on the compression work of earlier-ready groups, estimated from the previous
iterate), so every plan found is checked with the exact model and the caps are tightened
until it passes (or the fastest plan is taken).

Then progress per second decides between time and error: from the chosen plan the search
climbs towards more accurate options while ``(1 - progress_per_error x error) / step`` rises
(:mod:`autocomp.policy.progress`), so a plan outside the slack wins when the fast plans'
errors cost more per-step progress than the extra time (top-1% against PowerSGD rank 4 on a
slow link). The slack's pick buys the least error whatever that error is worth; where the
search predicts it learns less per second than the fastest plan, or than the fastest plan
climbed towards accuracy with errors priced ``error_cost_spread`` times higher, the climb
starts from the fastest plan instead (solver ``fastest``, or ``progress`` once it moves).
On the held-out 12-layer GPT at 50 Mbit/s the slack put PowerSGD rank 16 or int8 on four
matrices for a predicted 2.7% of the step (5.6% measured) while the engine's own rate said
-0.5%.

Two more rules keep the plan sensible and steady:

- **No near-useless option when a much better one is affordable.** An option whose relative
  error is at least ``useless_error`` sends almost nothing of the gradient (the error as the
  progress model counts it, :attr:`Pending.progress_errors`: top-k's is scaled by the square
  root of its family weight, so top-1% at 0.88 counts as 1.18); it is dropped from
  a layer's choices when another option's error is ``much_better`` lower and costs that layer
  at most ``time_slack`` x T* more, the layers' extra costs summed within that one slack
  (options at ``hopeless_error`` or more first, the worst first; then the rest, cheapest
  first). The squared-error objective alone would take it, because a layer with a small
  gradient norm weighs little, yet that layer would then barely train.
  On a layer under ``useless_min_numel`` elements it is dropped whatever the alternatives
  cost: errors weighed by size count such a layer (a classifier head, a position table) for
  little, and the few bytes a near-useless option saves there do not pay for a layer that
  stops training (top-1% of the digits CNN's 2,560-element head sends 25 values).
- **Hysteresis.** The optimizer sees each layer's current option ``switch_margin`` cheaper and
  more accurate (ties keep the plan), and the current plan as a whole is kept while its step
  is within twice the slack of T* (or it meets the target) and the new plan's error is not
  ``switch_margin`` lower: a switch discards warm starts and pays a few steps of higher error
  before it wins anything, and T* itself moves with the measurement noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from autocomp.exposure import Timeline
from autocomp.policy.optimizer import BudgetOptimizer, BudgetSolution, LayerOption
from autocomp.policy.plan_load import BucketGroups, GroupLoad, SearchProblem
from autocomp.policy.progress import progress_ascent, rate
from autocomp.policy.types import NONE_SPEC, LayerProfile, StepTiming

__all__ = [
    "KEPT_AT_TARGET",
    "KEPT_FOR_PROGRESS",
    "KEPT_WITHIN_TIME",
    "Pending",
    "SearchConfig",
    "SearchResult",
    "search",
]

_TOLERANCE = 1e-9


@dataclass(kw_only=True, slots=True)
class SearchConfig:
    """Settings of :func:`search` (the engine fills them from its config and the rules)."""

    time_slack: float = 0.1
    """Plans within this fraction of the fastest plan's step count as equally fast."""
    target_overlap: float = 0.9
    """A plan hiding this fraction of its communication is acceptable too."""
    switch_margin: float = 0.15
    """Hysteresis of the current plan (see the module docstring)."""
    useless_error: float = 0.95
    """Relative error at or above which an option sends almost nothing."""
    much_better: float = 0.25
    """How much lower another option's relative error must be to replace a useless one."""
    hopeless_error: float = 0.95
    """Relative error at or above which a near-useless option sends nothing a layer can train
    on: such drops get the shared slack first, the worst first."""
    useless_min_numel: int = 0
    """Layers with fewer elements never take a near-useless option, affordable or not."""
    resolution: int = 2000
    """Budget units of the knapsack program."""
    refinements: int = 4
    """Tightenings of the relaxed caps before falling back to the fastest plan."""
    progress_per_error: float = 0.0
    """Per-step progress one unit of summed option error costs (``error_cost`` over the
    pending layers' total weight); 0 turns the progress-per-second step off."""
    ascent_passes: int = 3
    """Passes of single-layer moves in the progress-per-second step."""
    error_cost_spread: float = 0.71 / 0.22
    """How far the per-step progress an error costs may lie above ``progress_per_error``:
    the top of ``error_cost``'s measured range over its bottom (0.71, PowerSGD rank 1 on the
    GPT LM; 0.22, rank 4 on the MLP LM; docs/policy.md). The default (0.33) is their
    geometric mean, and a given model may sit at either end. A faster plan displaces the
    slack's more accurate one only if it learns more per second at that price too."""


@dataclass(slots=True)
class Pending:
    """A layer left to the optimizer, with its options and any back-off note."""

    index: int
    """Position in the engine's layer list."""
    layer: LayerProfile
    options: list[LayerOption]
    """Undiscounted options, lightest first."""
    rel_errors: dict[str, float]
    note: str
    """Back-off note prefixed to the reason ('' without one)."""
    current: str | None = None
    """The spec the layer uses now, if it is among ``options``."""
    dropped: dict[str, str] = field(default_factory=dict)
    """Options removed as near-useless, with why (for the layer's reason)."""
    progress_errors: dict[str, float] = field(default_factory=dict)
    """Each option's relative error at what its family's error costs in per-step progress
    (``rel_error x sqrt(family weight)``); an option missing here counts its ``rel_errors``."""

    def option(self, key: str) -> LayerOption:
        return next(o for o in self.options if o.key == key)

    def progress_error(self, key: str) -> float:
        """The option's relative error as the progress it delivers counts it: what the
        near-useless rule judges (see the module docstring)."""
        return self.progress_errors.get(key, self.rel_errors[key])

    def drop(self, drops: dict[str, str]) -> None:
        """Remove these options (key -> why) from the layer's choices, noting why."""
        self.dropped.update(drops)
        self.options = [o for o in self.options if o.key not in drops]


@dataclass(frozen=True, slots=True)
class SearchResult:
    """The chosen option per pending layer and how it was chosen."""

    chosen: tuple[LayerOption, ...]
    """Per pending layer, in the order given."""
    runner_ups: tuple[LayerOption | None, ...]
    method: str
    """'slack', 'target', 'progress', 'fastest' or 'kept'."""
    timeline: Timeline
    fastest_added: float
    """What the fastest plan adds to the compute-only step (T* - compute)."""
    open_fastest_added: float
    """The same before near-useless options were dropped (what their allowance is taken of)."""
    budget_added: float
    """The most a plan may add and still count as fast: T* (1 + slack) - compute."""
    meets_target: bool
    kept_because: str = ""
    """Why the plan in use stayed (``method`` 'kept'): 'time' (its step within twice the
    slack of T*), 'target' (it meets the overlap target) or 'progress' (its predicted progress
    per second within the slack of the new plan's); '' otherwise."""


KEPT_WITHIN_TIME = "time"
KEPT_AT_TARGET = "target"
KEPT_FOR_PROGRESS = "progress"


def _fastest(options: Sequence[LayerOption]) -> LayerOption:
    return min(options, key=lambda o: (o.seconds, o.error, o.key))


def _fastest_plan(problem: SearchProblem, passes: int = 3) -> list[LayerOption]:
    """The fastest plan found: every layer's fastest option, then improved one layer at a
    time against the exact model (a layer whose communication hides behind the backward is
    fastest uncompressed, since its compression work would delay the backward for nothing)."""
    plan = problem.moves([_fastest(item.options) for item in problem.pending])
    for _ in range(passes):
        improved = False
        for index, item in enumerate(problem.pending):
            for option in sorted(item.options, key=lambda o: (o.seconds, o.error, o.key)):
                if option.key == plan.chosen[index].key:
                    continue
                tried = plan.trial(index, option)
                best = plan.timeline.added_s
                if tried.timeline.added_s < best - _TOLERANCE * max(1.0, best):
                    plan.move(index, option, tried)
                    improved = True
        if not improved:
            break
    return plan.chosen


def _greedy_accuracy(
    problem: SearchProblem, start: Sequence[LayerOption], fits: Callable[[Timeline], bool]
) -> list[LayerOption]:
    """From a plan that fits (``fits`` its timeline), switch layers to more accurate options
    while it still fits, biggest error reduction per added second first: a check on the
    knapsack, whose rounding to budget units can miss plans when the budget is tight."""
    plan = problem.moves(start)
    while True:
        moves = []
        for index, item in enumerate(problem.pending):
            current = plan.chosen[index]
            for option in item.options:
                gain = current.error - option.error
                if gain <= 0:
                    continue
                cost = max(option.seconds - current.seconds, 1e-12)
                moves.append((-gain / cost, index, option.key, option))
        for _, index, _, option in sorted(moves, key=lambda move: move[:3]):
            tried = plan.trial(index, option)
            if fits(tried.timeline):
                plan.move(index, option, tried)
                break
        else:
            return plan.chosen


def _meets_target(timeline: Timeline, target: float) -> bool:
    total = timeline.comm_s + timeline.work_s
    return timeline.exposed_s <= (1.0 - target) * total * (1 + _TOLERANCE) + 1e-12


def _useless_drops(item: Pending, allowance: float, config: SearchConfig) -> dict[str, str]:
    """The layer's near-useless options with a much better one at most ``allowance`` more
    (on a layer under ``useless_min_numel`` elements, any near-useless option while a useful
    one is left), each with why it goes."""
    drops: dict[str, str] = {}
    small = item.layer.numel < config.useless_min_numel and any(
        item.progress_error(o.key) < config.useless_error for o in item.options
    )
    for option in item.options:
        error = item.progress_error(option.key)
        if error < config.useless_error:
            continue
        # Where the family weight made it near-useless (top-k), say so: its own error is lower.
        raw = item.rel_errors[option.key]
        counted = "" if raw >= config.useless_error else f"counts as {error:.2f}; "
        if small:
            drops[option.key] = (
                f"{counted}never on a layer under {config.useless_min_numel} elements"
            )
            continue
        better = [
            other
            for other in item.options
            if item.progress_error(other.key) <= error - config.much_better
            and other.seconds - option.seconds <= allowance
        ]
        if better:
            replacement = min(better, key=lambda o: (o.seconds, item.progress_error(o.key), o.key))
            drops[option.key] = f"{counted}{replacement.key} costs under the slack"
    return drops


def _drop_useless(pending: Sequence[Pending], allowance: float, config: SearchConfig) -> None:
    """Remove near-useless options where a much better one is affordable, the slack spent
    once for the whole plan (see the module docstring).

    A layer's drops cost the plan what they add to that layer's fastest option, and all of
    them together stay within ``allowance``. Charged per layer, every layer could spend the
    whole slack: twelve 128x128 output projections of a 12-layer GPT at 50 Mbit/s each lost
    PowerSGD rank 4 (measured 0.906) for int8 at 2 ms more, 24 ms together against a 9 ms
    slack, and the plan measured 10% slower than rank 4 everywhere, which learned more per
    second (docs/benchmarks-history.md, "Held-out: a 12-layer GPT").

    The slack goes first to options at ``hopeless_error`` or more, which send nothing a
    layer can train on, the worst first; then to the band below, cheapest first. Cheapest
    first all the way up, it went to twelve cheap layers at 0.92-1.04 while a 192x768 MLP
    weight kept rank 4 at 1.0, and the plan swung back the next window
    (``tests/test_stability.py``). Within each band the layers already off their
    near-useless options come before those on one, so the layers that share the slack do
    not change from one decision to the next on measurement noise; a layer's lower band is
    only dropped once its hopeless options are. A small layer's drops are not charged and
    always hold, whatever they cost.
    """
    # (band, then the band's order, then position), extra, layer, its drops in that band
    entries: list[tuple[tuple[float, ...], float, Pending, dict[str, str]]] = []
    for position, item in enumerate(pending):
        drops = _useless_drops(item, allowance, config)
        if not drops:
            continue
        if item.layer.numel < config.useless_min_numel:
            item.drop(drops)
            continue
        top = {
            k: why for k, why in drops.items() if item.progress_error(k) >= config.hopeless_error
        }
        band = {k: why for k, why in drops.items() if k not in top}
        after_top = [o for o in item.options if o.key not in top]
        if top:
            extra = max(0.0, _fastest(after_top).seconds - _fastest(item.options).seconds)
            worst = max(item.progress_error(k) for k in top)
            moves = item.current is not None and item.current in top
            entries.append(((0, moves, -worst, extra, position), extra, item, top))
        if band:
            kept = [o for o in after_top if o.key not in band]
            extra = max(0.0, _fastest(kept).seconds - _fastest(after_top).seconds)
            moves = item.current is not None and item.current in band
            entries.append(((1, moves, extra, position), extra, item, band))
    spent = 0.0
    blocked: set[int] = set()  # layers whose top band did not fit: their lower band waits
    for key, extra, item, drops in sorted(entries, key=lambda entry: entry[0]):
        position = int(key[-1])
        if position in blocked or (extra > 0.0 and spent + extra > allowance * (1 + _TOLERANCE)):
            blocked.add(position)
            continue
        spent += extra
        item.drop(drops)


def _discounted(item: Pending, margin: float) -> list[LayerOption]:
    if item.current is None or len(item.options) < 2:
        return list(item.options)
    keep = 1.0 - margin
    return [
        LayerOption(
            o.key,
            o.seconds * keep,
            o.error * keep,
            o.wire_bytes,
            o.work * keep,
            o.first_round * keep,
            o.second_round * keep,
            o.final_work * keep,
            o.decode * keep,
            o.own_collective,
            o.own_latency * keep,
            o.own_charged * keep,
        )
        if o.key == item.current
        else o
        for o in item.options
    ]


def _caps(
    problem: SearchProblem,
    counts: Sequence[int],
    allowed: Sequence[float],
    chosen: Sequence[LayerOption],
) -> tuple[list[tuple[int, float]], float]:
    """Running-total caps for the knapsack: group i (reverse ready order) may add at most
    ``allowed[i]``. The compression work of earlier-ready groups enters every cap; it is taken
    from ``chosen`` (the previous iterate)."""
    groups = problem.groups.groups
    pending_work = [0.0] * len(groups)
    for item, option in zip(problem.pending, chosen, strict=True):
        pending_work[problem.groups.group_of[item.index]] += option.work
    caps: dict[int, float] = {}
    done = 0
    fixed_comm_prefix = 0.0
    for i in range(len(groups)):
        done += counts[i]
        fixed_comm_prefix += problem.fixed_comm[i]
        # Constraint i: C(groups 0..i) + W(groups i..) <= allowed_i. In pending seconds
        # (comm + work) over groups 0..i, the work of groups 0..i-1 was counted as if it
        # were communication, and the work of groups after i is missing.
        work_after = math.fsum(pending_work[i + 1 :]) + math.fsum(problem.fixed_work[i:])
        work_before = math.fsum(pending_work[:i])
        cap = allowed[i] - fixed_comm_prefix - work_after + work_before
        if done > 0:
            caps[done] = min(cap, caps.get(done, math.inf))
    total = caps.pop(done) if done in caps else math.inf
    return sorted(caps.items()), total


def _solve_caps(
    problem: SearchProblem,
    counts: Sequence[int],
    allowed_of: Callable[[Sequence[LayerOption]], list[float]],
    accept: Callable[[Sequence[LayerOption]], float],
    start: Sequence[LayerOption],
    config: SearchConfig,
    optimizer: BudgetOptimizer,
) -> tuple[list[LayerOption], BudgetSolution] | None:
    """The least-error plan whose exact check ``accept`` passes (<= 0), or None.

    The caps depend on the plan itself (the work of earlier-ready groups; the overlap target's
    allowance grows with the plan's communication), so they are taken from a reference plan,
    first ``start``, then each plan found: a plan that passes widens the next caps, one that
    fails tightens them by its excess.
    """
    reference = list(start)
    squeeze = 0.0
    best: tuple[list[LayerOption], BudgetSolution] | None = None
    seen: set[tuple[str, ...]] = set()
    for _ in range(config.refinements):
        allowed = [a - squeeze for a in allowed_of(reference)]
        caps, total = _caps(problem, counts, allowed, reference)
        if total < 0 or any(cap < 0 for _, cap in caps):
            break
        layers = [_discounted(item, config.switch_margin) for item in problem.pending]
        solution = optimizer.solve(layers, total, caps)
        if not solution.feasible:
            break
        chosen = [
            item.option(choice.option.key)
            for item, choice in zip(problem.pending, solution.choices, strict=True)
        ]
        key = tuple(o.key for o in chosen)
        excess = accept(chosen)
        if excess <= 0:
            error = math.fsum(o.error for o in chosen)
            if best is None or error < math.fsum(o.error for o in best[0]):
                best = (chosen, solution)
            squeeze = 0.0
        else:
            squeeze += excess
        if key in seen and excess <= 0:
            break
        seen.add(key)
        reference = chosen
    return best


def search(
    pending: Sequence[Pending],
    groups: BucketGroups,
    fixed: GroupLoad,
    timing: StepTiming,
    config: SearchConfig,
    reference: SearchResult | None = None,
) -> SearchResult:
    """The plan for the pending layers; ``fixed`` is what the rule-decided layers and the
    per-bucket latency put on each group. See the module docstring.

    ``reference``: the search of the same decision with no layer held (the engine's dwell
    locks put held layers in ``fixed``). Its fastest plans are T* here: held layers' extra
    time spends this plan's slack, and their drops the near-useless allowance. Measured from
    the held plan's own fastest step instead, each window's locks raised T* and the next
    free layers got a fresh slack on top: on the held-out 12-layer GPT at 50 Mbit/s, int8
    spread from 8 to 19 matrices in four windows, and the predicted step from 0.327 to
    0.355 s with T* rising alongside (docs/benchmarks-history.md, "Held-out: a 12-layer GPT").
    """
    problem = SearchProblem(pending, groups, fixed.copy())
    # Every plan's step starts from the compute-only step plus the measured per-step gap.
    compute = timing.base
    fastest = _fastest_plan(problem)
    open_added = problem.timeline(fastest).added_s
    if reference is None:
        raw_added, spent = open_added, 0.0
    else:
        raw_added = reference.open_fastest_added
        spent = max(0.0, open_added - raw_added)
    allowance = max(0.0, config.time_slack * (compute + raw_added) - spent)
    _drop_useless(pending, allowance, config)
    for item in pending:
        if item.current is not None and all(o.key != item.current for o in item.options):
            item.current = None
    fastest = _fastest_plan(problem)
    fastest_timeline = problem.timeline(fastest)
    star_added = fastest_timeline.added_s if reference is None else reference.fastest_added
    star = compute + star_added
    # Held layers past the slack leave the free ones their fastest options.
    budget = max((1.0 + config.time_slack) * star - compute, fastest_timeline.added_s)
    optimizer = BudgetOptimizer(BudgetOptimizer.Config(resolution=config.resolution))
    counts = [0] * len(groups.groups)
    for item in pending:
        counts[groups.group_of[item.index]] += 1
    hideable = [g.hideable for g in groups.groups]

    # Within the time slack of the fastest plan.
    slack = _solve_caps(
        problem,
        counts,
        lambda _: [budget + h for h in hideable],
        lambda chosen: problem.timeline(chosen).added_s - budget,
        fastest,
        config,
        optimizer,
    )
    candidates: list[tuple[str, list[LayerOption], BudgetSolution | None]] = []
    if slack is not None:
        candidates.append(("slack", *slack))
    greedy = _greedy_accuracy(
        problem, fastest, lambda timeline: timeline.added_s <= budget + _TOLERANCE
    )
    candidates.append(("slack", greedy, None))

    # Meeting the overlap target (hiding communication is free), when the fastest plan can.
    target = config.target_overlap
    if target <= 0:
        # Nothing needs hiding: every plan meets the target, each layer its least error.
        least = [min(item.options, key=lambda o: (o.error, o.seconds, o.key)) for item in pending]
        candidates.append(("target", least, None))
    elif _meets_target(fastest_timeline, target):

        def target_allowed(reference: Sequence[LayerOption]) -> list[float]:
            timeline = problem.timeline(reference)
            room = (1.0 - target) * (timeline.comm_s + timeline.work_s)
            # exposed = added - W, so "exposed <= room" is "added <= W + room".
            return [h + room + timeline.work_s for h in hideable]

        def target_excess(chosen: Sequence[LayerOption]) -> float:
            timeline = problem.timeline(chosen)
            return timeline.exposed_s - (1.0 - target) * (timeline.comm_s + timeline.work_s)

        hidden = _solve_caps(
            problem, counts, target_allowed, target_excess, fastest, config, optimizer
        )
        if hidden is not None:
            candidates.append(("target", *hidden))

    def error(chosen: Sequence[LayerOption]) -> float:
        return math.fsum(o.error for o in chosen)

    method, chosen, solution = min(candidates, key=lambda c: (error(c[1]), c[0]))
    per_error = config.progress_per_error
    if per_error > 0:
        climbed: list[LayerOption] | None = None
        if method == "slack":
            if rate(problem, chosen, compute, per_error) < rate(
                problem, fastest, compute, per_error
            ):
                # The slack's least error is bought blind to its size: where the engine
                # itself predicts it learns less per second than the fastest plan, the climb
                # below starts from the fastest plan and buys only what pays.
                method, chosen, solution = "fastest", list(fastest), None
            else:
                climbed = _climb_if_it_outlearns(problem, chosen, fastest, compute, config)
                if climbed is not None:
                    method, chosen, solution = "fastest", list(fastest), None
        if climbed is None:
            climbed = progress_ascent(
                problem, chosen, compute, per_error, passes=config.ascent_passes
            )
        if [o.key for o in climbed] != [o.key for o in chosen]:
            method, chosen, solution = "progress", climbed, None
    timeline = problem.timeline(chosen)

    # Keep the current plan while it is acceptable and the new one is not clearly better.
    kept_because = ""
    if all(item.current is not None for item in pending) and pending:
        current = [item.option(item.current) for item in pending]  # type: ignore[arg-type]
        current_timeline = problem.timeline(current)
        # The plan in use gets twice the slack: noise in T* alone must not evict it.
        keep_budget = max(
            (1.0 + 2.0 * config.time_slack) * star - compute, fastest_timeline.added_s
        )
        # The first condition that holds, in this order (the explanation names it).
        if current_timeline.added_s <= keep_budget * (1 + _TOLERANCE):
            acceptable = KEPT_WITHIN_TIME
        elif _meets_target(current_timeline, target):
            acceptable = KEPT_AT_TARGET
        elif per_error > 0 and rate(problem, current, compute, per_error) >= (
            1.0 - config.time_slack
        ) * rate(problem, chosen, compute, per_error):
            acceptable = KEPT_FOR_PROGRESS
        else:
            acceptable = ""
        changed = any(c.key != o.key for c, o in zip(current, chosen, strict=True))
        if acceptable and changed and error(chosen) > (1.0 - config.switch_margin) * error(current):
            method, chosen, solution, timeline = "kept", current, None, current_timeline
            kept_because = acceptable

    runner_ups = _runner_ups(pending, chosen, solution)
    return SearchResult(
        chosen=tuple(chosen),
        runner_ups=runner_ups,
        method=method,
        timeline=timeline,
        fastest_added=star_added,
        open_fastest_added=raw_added,
        budget_added=budget,
        meets_target=_meets_target(timeline, target),
        kept_because=kept_because,
    )


def _climb_if_it_outlearns(
    problem: SearchProblem,
    slack_plan: Sequence[LayerOption],
    fastest: Sequence[LayerOption],
    compute: float,
    config: SearchConfig,
) -> list[LayerOption] | None:
    """The fastest plan climbed towards accuracy (:func:`progress_ascent`), when it learns
    more per second than the slack's plan even with every error priced at
    ``error_cost_spread`` times ``progress_per_error``; else None.

    Against the fastest plan alone the slack's plan can win by being slightly less wrong than
    a bad plan: on the GPT LM at 1 Gbit/s the fastest plan had PowerSGD on 7 matrices, and
    the slack spent its 3% on moving matrices from fp16 (relative error 3e-4, no measurable
    loss per step) to none. The run then stepped 0.164 s with 7 of 14 matrices uncompressed
    where all-fp16 steps 0.152-0.157 s, and the payoff check, which asks 5% of a compressed
    plan, held all compression off for 500 steps (docs/benchmarks-history.md, thirty-fifth
    session). The climb from the fastest plan finds all-fp16 there. At the nominal price it
    also edges past the slack's plan by putting PowerSGD back on four matrices for a
    predicted 0.8% more progress per second, a bet smaller than what ``error_cost`` is
    uncertain by (0.22-0.71 of a step per unit of error across models and PowerSGD ranks,
    0.33 the default); priced ``error_cost_spread`` (3.2) times higher, the accurate plan
    stays. And the climb must be predicted faster than every layer uncompressed by more than
    the slack: inside it, whether compressing at all pays is not something the predictions
    can tell."""
    per_error = config.progress_per_error
    climbed = progress_ascent(problem, fastest, compute, per_error, passes=config.ascent_passes)
    # Compression itself must be resolvable: a climb predicted within the slack of every
    # layer uncompressed leaves the slack's plan (on a fast link, where compressing saves 1%
    # of a long step, that plan is 'none' everywhere, and a compressed plan would have to
    # measure min_gain faster to stay).
    uncompressed = [
        next((o for o in item.options if o.key == NONE_SPEC), kept)
        for item, kept in zip(problem.pending, slack_plan, strict=True)
    ]
    uncompressed_added = problem.timeline(uncompressed).added_s
    if (compute + problem.timeline(climbed).added_s) * (1.0 + config.time_slack) >= (
        compute + uncompressed_added
    ):
        return None
    pessimistic = per_error * config.error_cost_spread
    if rate(problem, slack_plan, compute, pessimistic) < rate(
        problem, climbed, compute, pessimistic
    ):
        return climbed
    return None


def _runner_ups(
    pending: Sequence[Pending],
    chosen: Sequence[LayerOption],
    solution: BudgetSolution | None,
) -> tuple[LayerOption | None, ...]:
    out: list[LayerOption | None] = []
    for index, (item, option) in enumerate(zip(pending, chosen, strict=True)):
        runner = None
        if solution is not None and solution.choices[index].runner_up is not None:
            key = solution.choices[index].runner_up.key  # type: ignore[union-attr]
            runner = item.option(key)
        else:
            others = [o for o in item.options if o.key != option.key]
            if others:
                runner = min(others, key=lambda o: (o.error, o.seconds, o.key))
        out.append(runner)
    return tuple(out)
