"""The gradient-norm tests of the convergence guards: critical regimes and loss-scale changes.

Its own module because both tests read one piece of state, the per-layer reference gradient
norm, which :class:`~autocomp.guards.ConvergenceGuards` otherwise never touches: the guards
feed it each window's rank-combined norms and turn what it reports into events and back-off.

* ``critical_regime`` (Accordion, Agarwal et al. 2021): the median norm of an interval of
  ``block`` windows differs by more than ``change`` (relative) from the reference built from
  the calm intervals before, in ``patience`` intervals in a row (same direction) -> the layer
  is in a critical regime until an interval is calm again. Calm intervals move the reference
  by ``smoothing`` x the difference; a firing makes the new level the reference.
* ``loss_scale``: every layer's norm moved by the same power of two at once (what AMP's
  GradScaler does when it changes its scale) -> the references, and the norms of the open
  intervals, are multiplied by that factor, so the critical-regime test does not fire on it.
  A fall counts only after an overflow: GradScaler lowers its scale at a step with a
  non-finite gradient and at no other. A converged classifier's norms also fall by a power of
  two at once (every layer's gradient scales with the same loss residual), and taking such a
  dip for a scale change rescaled every reference by 1/8 and fired a critical regime on the
  rebound (the digits CNN at 10 Mbit/s, step 400).

Pure logic, like the rest of the guards: every rank must feed it the same numbers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["IntervalVerdict", "NormRegimes"]


@dataclass(frozen=True, slots=True)
class IntervalVerdict:
    """What one window's norm did to a layer's Accordion test (neither field set: the
    interval is still open, or over the threshold for fewer than ``patience`` intervals)."""

    calm: bool = False
    """The window closed an interval within ``change`` of the reference (or nothing was
    compressed): Accordion's cue to compress as before."""
    detail: str | None = None
    """Set when the change persisted ``patience`` intervals: a critical regime (the numbers)."""


_UNDECIDED = IntervalVerdict()
_CALM = IntervalVerdict(calm=True)


@dataclass(slots=True)
class NormRegimes:
    """State of the gradient-norm tests (the guards checkpoint ``reference``, ``streak`` and
    ``block_norms``)."""

    change: float
    """Relative norm change against the reference that marks a critical regime."""
    patience: int
    """Intervals in a row the change must persist, in the same direction."""
    smoothing: float
    """EWMA weight of a calm interval's norm in the reference."""
    block: int
    """Windows per Accordion interval."""
    scale_tolerance: float
    """Distance (log2 units) from a power of two still taken for a loss-scale change."""
    reference: dict[str, float] = field(default_factory=dict)
    """Reference gradient norm per layer (smoothed over calm intervals)."""
    common_ratio: float | None = None
    """Median norm/reference ratio of the last window without a loss-scale change: the common
    drift, divided out when looking for a scale change."""
    block_norms: dict[str, list[float]] = field(default_factory=dict)
    """The window norms of each layer's current Accordion interval."""
    streak: dict[str, int] = field(default_factory=dict)
    """Consecutive intervals over the threshold per layer (signed: + up, - down)."""

    def check_critical(self, name: str, grad: float, compressing: bool) -> IntervalVerdict:
        """Add one window's norm of ``name``; the verdict on the interval it closes, if any.
        Nothing fires while not ``compressing`` (the reference still follows)."""
        if not math.isfinite(grad):
            return _UNDECIDED  # keep the last finite norm as the reference
        block = [*self.block_norms.get(name, []), grad]
        if len(block) < self.block:
            self.block_norms[name] = block
            return _UNDECIDED
        self.block_norms[name] = []
        level = statistics.median(block)
        reference = self.reference.get(name)
        if reference is None or reference <= 0.0:
            self.reference[name] = level
            self.streak[name] = 0
            return _CALM
        change = (level - reference) / reference
        if abs(change) <= self.change or not compressing:
            # Calm (or not compressing yet): the reference follows, smoothed.
            self.reference[name] = reference + self.smoothing * (level - reference)
            self.streak[name] = 0
            return _CALM
        direction = 1 if change > 0 else -1
        streak = self.streak.get(name, 0)
        streak = streak + direction if streak * direction > 0 else direction
        self.streak[name] = streak
        if abs(streak) < self.patience:
            return _UNDECIDED  # the reference stays where the calm intervals left it
        self.reference[name] = level  # the new regime is the next reference
        self.streak[name] = 0
        unit = "intervals" if self.block > 1 else "windows"
        detail = (
            f"|d|g||/|g| = {abs(change):.3g} > {self.change:g} for {abs(streak)} "
            f"{unit} (|g| {reference:.4g} -> {level:.4g})"
        )
        return IntervalVerdict(detail=detail)

    def check_loss_scale(
        self, grad_norms: Mapping[str, float], *, overflowed: bool
    ) -> float | None:
        """Rescale the references when all layers moved by one power of two (GradScaler);
        returns that factor, or None when the window shows no loss-scale change.

        ``overflowed``: a step with a non-finite gradient was seen in this window or the one
        before; only then can the factor be below 1.
        """
        ratios = []
        for name, grad in grad_norms.items():
            reference = self.reference.get(name)
            if reference and reference > 0 and math.isfinite(grad) and grad > 0:
                ratio = grad / reference
                if math.isfinite(ratio) and ratio > 0:
                    ratios.append(ratio)
        if len(ratios) < 2:
            return None
        ratios.sort()
        median = ratios[len(ratios) // 2]
        # Norms drift while training (7-17% per window measured at lr 0.1), and a 2x scale
        # growth on top of a 7.5% drift measures 2.15x, outside the tolerance. So the change is
        # also tried with the last window's common drift divided out.
        # Only a drift is divided out: a common ratio beyond sqrt(2) is a jump (a rejected
        # dip's 1/8, divided out, would read the rebound as an 8x growth).
        drift = self.common_ratio
        drifting = drift is not None and abs(math.log2(drift)) < 0.5
        trends = [1.0, drift] if drifting else [1.0]
        exponent = 0
        for trend in trends:
            quotient = median / trend
            if not (math.isfinite(quotient) and quotient > 0):
                continue  # a denormal reference or trend: no factor to read
            value = math.log2(quotient)
            nearest = round(value)
            if nearest == 0 or abs(nearest) > 64 or (nearest < 0 and not overflowed):
                continue
            if abs(value - nearest) > self.scale_tolerance:
                continue
            # Every layer must share the factor (a loss scale multiplies all gradients alike).
            shared = sum(1 for r in ratios if abs(math.log2(r / trend) - nearest) <= 0.25)
            if shared >= 0.8 * len(ratios):
                exponent = nearest
                break
        if exponent == 0:
            self.common_ratio = median
            return None
        factor = 2.0**exponent
        for name in self.reference:
            self.reference[name] *= factor
        for name, block in self.block_norms.items():
            self.block_norms[name] = [value * factor for value in block]
        return factor
