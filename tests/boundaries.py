"""The adaptive loop's boundary schedule, as the multi-rank tests check it.

With ``quiet_window_seconds=0`` a run holds a boundary at every early look and every window,
the plain schedule a test can write down. One more kind is timing's to decide: when the
payoff check seeks an uncompressed baseline, rank 0 asks every rank for a short window
(``PayoffCheck.baseline_window_steps``), a boundary off that schedule. On a loopback run of
a few steps that happened in about one run in three (thirty-fifth session), so a test
that lists the plain schedule accepts those, and only those, besides it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

BASELINE_HOLD = "measuring an uncompressed baseline"
"""How the reason of a decision that holds the layers uncompressed for a baseline starts."""


def baseline_hold_steps(decisions: Iterable[tuple[int, Mapping[str, Any] | None]]) -> list[int]:
    """Steps of the (step, decision) pairs whose decision held a layer for a baseline
    (rank 0's records carry the decision; other ranks' do not)."""
    return [
        step
        for step, decision in decisions
        if decision and any(BASELINE_HOLD in d["reason"] for d in decision.get("layers", []))
    ]


def assert_plain_schedule(
    boundaries: Sequence[int], plain: Sequence[int], baseline_holds: Sequence[int]
) -> None:
    """Every boundary of ``plain`` ran, and any other follows a baseline hold."""
    assert set(plain) <= set(boundaries), (boundaries, plain)
    for extra in sorted(set(boundaries) - set(plain)):
        before = max((b for b in boundaries if b < extra), default=None)
        assert before in baseline_holds, (boundaries, plain, baseline_holds)
