"""Which link reading a decision prices: the idle link's, while a compressed plan misreads it.

The bandwidth meter reads the link from each step's busy periods. While the optimizer
compresses, those periods hold what the plan does besides moving bytes: PowerSGD's small
rounds wait on the compression work that shares the two cores (and, pipelined, on the next
bucket's backward). On loopback the MLP LM read 291-420 MB/s in its PowerSGD windows against
900-1,000 MB/s uncompressed just before and 1,215 MB/s from a link probe just after
(thirty-third session, seeds 1 and 3). Priced on the low reading, every uncompressed layer
looked 2-3x dearer, and the decision at that boundary made a second bet: fp16 on the
embedding, fc1 and the output layer, held by its dwell for a window before the probe moved
it back.

So a compressed window whose estimate moved by ``link_change`` or more from the last
uncompressed window's is not taken at its word. The decision prices the uncompressed
window's estimate instead and asks for a link probe (the payoff check's reference size), and
the probe settles it at the next boundary: when it reads the idle link as the reference
probe did, the compressed plan's readings keep being replaced for ``confirm_windows``
windows (then another probe); when it reads a moved link, the compressed reading counts and
the uncompressed one is forgotten. A real link change while compressed thus costs one
decision on the old link. Without a reference probe (no opening, no uncompressed probe yet)
nothing can be confirmed and every reading counts, as before.

Rank 0 runs it inside the planner; its state is part of the controller's checkpoint.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from autocomp.link_model import LinkEstimate, bandwidth_moved

logger = logging.getLogger(__name__)

__all__ = ["IdleLink"]


class IdleLink:
    """Replaces a compressed plan's moved link reading by the idle link's until a probe
    says the link moved (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """When a reading counts as moved, and how long a probe's confirmation holds."""

        link_change: float = 2.0
        """Bandwidth ratio between a compressed and the uncompressed reading that needs a
        probe to tell the plan's traffic from a link change (the planner's ``link_change``)."""
        confirm_windows: int = 10
        """Windows a probe's "the idle link is unchanged" holds before another is asked."""

        def __post_init__(self) -> None:
            if not self.link_change > 1.0:
                raise ValueError(f"link_change must be > 1, got {self.link_change}")
            if self.confirm_windows < 1:
                raise ValueError(f"confirm_windows must be >= 1, got {self.confirm_windows}")

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or IdleLink.Config()
        self._idle: LinkEstimate | None = None
        """The estimate of the latest window that compressed nothing the optimizer decides."""
        self._confirmed_at: int | None = None
        """Window at which a probe read the idle link unchanged while compressed."""
        self._asked_at: int | None = None
        """Window at which a probe was asked for and has not been read yet."""
        self._probe_wanted = False
        self.replaced = 0
        """Decisions priced on the idle reading instead of the compressed plan's."""

    def priced(
        self,
        window: int,
        estimate: LinkEstimate | None,
        *,
        compressed: bool,
        reference: bool,
        probe_agrees: bool | None,
    ) -> LinkEstimate | None:
        """The estimate to price this window's decision on.

        ``window``: the planner's window count. ``estimate``: the meter's reading of the
        window. ``compressed``: whether the optimizer compressed any layer in it.
        ``reference``: an uncompressed link probe exists to compare a probe with (without
        one nothing can be confirmed, and every reading counts).
        ``probe_agrees``: a link probe taken at the end of this window read the link as the
        uncompressed reference probe did (True), or moved from it (False); None when no probe
        was read or there is no reference to compare with.
        """
        if estimate is None:
            return None
        if not compressed:
            self._idle, self._confirmed_at, self._asked_at = estimate, None, None
            return estimate
        idle = self._idle
        if (
            idle is None
            or not reference
            or not bandwidth_moved(
                idle.bandwidth_bytes_per_s, estimate.bandwidth_bytes_per_s, self.config.link_change
            )
        ):
            self._asked_at = None
            return estimate
        if probe_agrees is False:
            logger.info(
                "autocomp: a link probe confirms the move to %.0f MB/s read while compressed "
                "(%.0f MB/s uncompressed before)",
                estimate.bandwidth_bytes_per_s / 1e6,
                idle.bandwidth_bytes_per_s / 1e6,
            )
            self._idle, self._confirmed_at, self._asked_at = None, None, None
            return estimate
        confirmed = self._confirmed_at
        if probe_agrees:
            self._confirmed_at, self._asked_at = window, None
        elif confirmed is None or window - confirmed >= self.config.confirm_windows:
            if self._asked_at is not None and window > self._asked_at:
                # The probe asked for did not come (none can be taken here): nothing confirms
                # the idle reading any more.
                self._idle, self._confirmed_at, self._asked_at = None, None, None
                return estimate
            self._asked_at, self._probe_wanted = window, True
        self.replaced += 1
        logger.info(
            "autocomp: the compressed plan read the link at %.0f MB/s, %.1fx off the "
            "uncompressed %.0f MB/s; deciding on the uncompressed reading (%s)",
            estimate.bandwidth_bytes_per_s / 1e6,
            max(idle.bandwidth_bytes_per_s, estimate.bandwidth_bytes_per_s)
            / min(idle.bandwidth_bytes_per_s, estimate.bandwidth_bytes_per_s),
            idle.bandwidth_bytes_per_s / 1e6,
            "a probe confirmed the idle link" if self._asked_at is None else "a probe will tell",
        )
        return idle

    def probe_wanted(self) -> bool:
        """Whether a probe should run at the next boundary; asked once."""
        wanted, self._probe_wanted = self._probe_wanted, False
        return wanted

    def state_dict(self) -> dict[str, Any]:
        return {
            "idle": None if self._idle is None else self._idle.to_dict(),
            "confirmed_at": self._confirmed_at,
            "asked_at": self._asked_at,
            "replaced": self.replaced,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        idle = state.get("idle")
        self._idle = None if idle is None else LinkEstimate.from_dict(idle)
        confirmed, asked = state.get("confirmed_at"), state.get("asked_at")
        self._confirmed_at = None if confirmed is None else int(confirmed)
        self._asked_at = None if asked is None else int(asked)
        self.replaced = int(state.get("replaced", 0))
        self._probe_wanted = False
