"""Reasons in words: every layer's decision says what decided it, with the numbers."""

from __future__ import annotations

from autocomp.policy.optimizer import LayerOption
from autocomp.policy.search import (
    KEPT_AT_TARGET,
    KEPT_FOR_PROGRESS,
    Pending,
    SearchResult,
)
from autocomp.policy.types import RULE_KNAPSACK, RULE_SLACK, LayerDecision

__all__ = ["bytes_text", "optimizer_decision", "option_decision", "seconds_text"]


def seconds_text(seconds: float) -> str:
    return f"{seconds:.3g} s"


def bytes_text(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} B"


_HEADS = {
    "slack": "least error within {slack:.0%} of the fastest plan's step",
    "target": "least error hiding {target:.0%} of communication behind the backward",
    "progress": "most predicted progress per second (the error-weighted plans within "
    "{slack:.0%} of the fastest step learn less per second)",
    "fastest": "fastest plan (the least error within {slack:.0%} of its step predicts less "
    "progress per second)",
    "kept": "plan kept ({kept}; the best alternative was not {margin:.0%} more accurate)",
}


def _kept_text(because: str, slack: float) -> str:
    """Which of the keep rule's conditions held (``SearchResult.kept_because``)."""
    if because == KEPT_AT_TARGET:
        return "it meets the overlap target"
    if because == KEPT_FOR_PROGRESS:
        return f"its predicted progress per second is within {slack:.0%} of the new plan's"
    # The plan in use gets twice the slack, so the noise in T* alone cannot evict it.
    return f"its step is within {2 * slack:.0%} of the fastest plan's, twice the slack"


def optimizer_decision(
    item: Pending,
    chosen: LayerOption,
    runner: LayerOption | None,
    result: SearchResult,
    *,
    slack: float,
    target: float,
    margin: float,
) -> LayerDecision:
    """The decision of one layer the plan search chose, with its reason."""
    kept = _kept_text(result.kept_because, slack) if result.method == "kept" else ""
    head = _HEADS[result.method].format(slack=slack, target=target, margin=margin, kept=kept)
    reason = (
        f"{item.note}{head}: {chosen.key} predicts {seconds_text(chosen.seconds)}, "
        f"{bytes_text(chosen.wire_bytes)}, rel. error {item.rel_errors[chosen.key]:.3g}"
    )
    if runner is None:
        reason += "; no other candidate"
    else:
        reason += (
            f"; runner-up {runner.key} {seconds_text(runner.seconds)}, "
            f"rel. error {item.rel_errors[runner.key]:.3g}"
        )
    if item.dropped:
        dropped = ", ".join(
            f"{key} (rel. error {item.rel_errors[key]:.2f}; {why})"
            for key, why in sorted(item.dropped.items())
        )
        reason += f"; not considered: {dropped}"
    rule = RULE_KNAPSACK if result.meets_target else RULE_SLACK
    return option_decision(item, chosen, reason, rule, runner)


def option_decision(
    item: Pending,
    option: LayerOption,
    reason: str,
    rule: str,
    runner: LayerOption | None = None,
) -> LayerDecision:
    """A search layer's decision for one of its options, priced as that option (with the
    runner-up's figures when one is named)."""
    return LayerDecision(
        name=item.layer.name,
        spec=option.key,
        reason=reason,
        rule=rule,
        predicted_seconds=option.seconds,
        predicted_work_seconds=option.work,
        predicted_rounds_seconds=(option.first_round, option.second_round),
        predicted_late_work_seconds=(option.final_work, option.decode),
        predicted_wire_bytes=option.wire_bytes,
        predicted_error=option.error,
        runner_up=None if runner is None else runner.key,
        runner_up_seconds=None if runner is None else runner.seconds,
        runner_up_error=None if runner is None else runner.error,
    )
