"""The loss-divergence test of the convergence guards, on the rank-averaged training loss.

Its own module because it is the one guard that watches the loss rather than per-layer norms:
:class:`~autocomp.guards.ConvergenceGuards` feeds it every observed loss and, when it fires,
backs every layer off one level. The rule (the ``loss_divergence`` guard):

* warm-up losses build an EWMA; at the first loss after warm-up the EWMA is frozen as the
  baseline (that loss itself if warm-up saw none);
* afterwards the loss diverges when its EWMA stays above ``baseline + margin`` (``margin =
  (ratio - 1) * |baseline|``) for ``patience`` observations in a row and ends that streak
  higher than it began. A single spike only decays, so it never fires;
* each further firing needs the EWMA to stay above ``EWMA at the last firing + margin`` the
  same way, so an EWMA catching up with a loss that merely stays high does not escalate.

Pure logic, like the rest of the guards: every rank must feed it the same numbers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["LossDivergence"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LossDivergence:
    """State of the loss-divergence test (every field is checkpointed by the guards)."""

    alpha: float
    """EWMA weight of a new loss."""
    ratio: float
    """Loss EWMA above this multiple of the baseline counts as diverging."""
    patience: int
    """Consecutive diverging, rising observations before it fires."""
    ewma: float | None = None
    baseline: float | None = None
    streak: int = 0
    reference: float | None = None
    """EWMA when the current above-threshold streak began."""
    escalation_bar: float | None = None
    """EWMA level a further firing must exceed (last firing's EWMA + margin)."""
    troubled: bool = False
    """An observation was above the divergence threshold since the guards last cleared it."""

    def unfreeze(self) -> None:
        """Drop the baseline (the warm-up resumed): the next compressing loss freezes it
        again, so a loss read before the warm-up really ended is never the reference."""
        self.baseline = None
        self.streak = 0
        self.reference = None
        self.escalation_bar = None

    def observe(self, step: int, value: float, compressing: bool) -> str | None:
        """Feed one finite loss; returns what diverged when the test fires, else None.

        ``compressing``: ``step`` is past the warm-up (the first such loss freezes the
        baseline).
        """
        if compressing and self.baseline is None:
            self.baseline = value if self.ewma is None else self.ewma
            logger.info("autocomp guards step %d: loss baseline %.6g frozen", step, self.baseline)
        if self.ewma is None:
            self.ewma = value
        else:
            self.ewma += self.alpha * (value - self.ewma)
        if self.baseline is None:
            return None

        ewma = self.ewma
        margin = (self.ratio - 1.0) * abs(self.baseline)
        threshold = self.baseline + margin
        if ewma <= threshold:
            self.streak = 0
            self.reference = None
            self.escalation_bar = None
            return None
        self.troubled = True
        bar = threshold if self.escalation_bar is None else self.escalation_bar
        if ewma <= bar:
            self.streak = 0
            self.reference = None
            return None
        if self.reference is None:
            self.reference = ewma
        self.streak += 1
        if self.streak < self.patience or ewma <= self.reference:
            return None
        detail = (
            f"loss EWMA {ewma:.6g} > {bar:.6g} ({self.ratio:g} x baseline "
            f"{self.baseline:.6g}) for {self.streak} observations, up from "
            f"{self.reference:.6g}"
        )
        self.streak = 0
        self.reference = None
        self.escalation_bar = max(threshold, ewma + margin)
        return detail
