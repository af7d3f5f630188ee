"""Does compression pay on this link? Checked against measured step times, not predictions.

The engine's predictions (exposure, compression work) carry errors the cost model only
partly learns: compression competes with the backward and the communication threads for the
same cores, and an idle-link probe can read a loopback far faster than the link is during
training. Near the point where compression stops paying those errors decide, and a plan that
is predicted 5% faster may measure slower. So every settled window's median step time (one
that ran the same plan as the window before it: no switch costs) is kept with the plan that
produced it, and a compressed plan is compared with the latest uncompressed window on a
similar link (bandwidth within ``link_change``). If it is not ``min_gain`` faster,
compression is held off: the optimizer's layers stay uncompressed for ``hold_windows``
windows, or until the link estimate moves by ``link_change`` from the one held at, whichever
comes first. Then the engine may try again, one window.

Rank 0 runs it (it decides); its state is part of the controller's checkpoint.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["PayoffCheck"]


@dataclass(slots=True)
class _Observation:
    window: int
    step_seconds: float
    bandwidth_bytes_per_s: float


class PayoffCheck:
    """Holds compression off where a compressed window measured no faster than an
    uncompressed one on the same link (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """When a compressed plan counts as paying off, and how long a hold lasts."""

        min_gain: float = 0.05
        """A compressed window must be this much faster than the uncompressed baseline."""
        hold_windows: int = 10
        """Windows a hold lasts before the engine may try compression again."""
        link_change: float = 2.0
        """Bandwidth ratio that makes a baseline or a hold stale (the link changed)."""

        def __post_init__(self) -> None:
            if not 0.0 <= self.min_gain < 1.0:
                raise ValueError(f"min_gain must be in [0, 1), got {self.min_gain}")
            if self.hold_windows < 1:
                raise ValueError(f"hold_windows must be >= 1, got {self.hold_windows}")
            if not self.link_change > 1.0:
                raise ValueError(f"link_change must be > 1, got {self.link_change}")

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or PayoffCheck.Config()
        self._baseline: _Observation | None = None
        self._held_at: _Observation | None = None
        self.holds = 0
        """Holds started so far."""
        self.last_gain: float | None = None
        """Measured gain of the latest compressed window against its baseline, if any."""

    def _similar(self, a: float, b: float) -> bool:
        ratio = max(a, b) / max(min(a, b), 1e-30)
        return ratio < self.config.link_change

    def observe(
        self, window: int, compressed: bool, step_seconds: float, bandwidth: float | None
    ) -> str | None:
        """Record one window's median step under the plan it ran; a note when a hold starts.

        ``compressed``: whether the optimizer compressed any layer during the window (rule
        decisions such as pins count as neither).
        """
        if bandwidth is None or not (math.isfinite(step_seconds) and step_seconds > 0):
            return None
        observation = _Observation(window, step_seconds, bandwidth)
        if not compressed:
            self._baseline = observation
            return None
        base = self._baseline
        if base is None or not self._similar(base.bandwidth_bytes_per_s, bandwidth):
            self.last_gain = None
            return None
        gain = 1.0 - step_seconds / base.step_seconds
        self.last_gain = gain
        if gain >= self.config.min_gain:
            return None
        self._held_at = observation
        self.holds += 1
        note = (
            f"compression measured no payoff: {step_seconds * 1e3:,.0f} ms/step compressed vs "
            f"{base.step_seconds * 1e3:,.0f} ms uncompressed (window {base.window}) on a "
            f"{bandwidth * 8 / 1e6:,.0f} Mbit/s link, gain {gain:.1%} < min_gain "
            f"{self.config.min_gain:.0%}; uncompressed for up to {self.config.hold_windows} "
            "windows"
        )
        logger.info("autocomp: %s", note)
        return note

    def hold_reason(self, window: int, bandwidth: float | None) -> str | None:
        """Why the optimizer's layers stay uncompressed at this window, or None."""
        held = self._held_at
        if held is None:
            return None
        expired = window - held.window >= self.config.hold_windows
        moved = bandwidth is not None and not self._similar(held.bandwidth_bytes_per_s, bandwidth)
        if expired or moved:
            self._held_at = None
            return None
        return (
            f"compression measured no payoff at window {held.window} "
            f"({held.step_seconds * 1e3:,.0f} ms/step compressed vs the uncompressed "
            f"baseline, gain under min_gain {self.config.min_gain:.0%}); held off until "
            f"window {held.window + self.config.hold_windows} or a "
            f"{self.config.link_change:g}x link change"
        )

    def state_dict(self) -> dict[str, Any]:
        def pack(o: _Observation | None) -> list[float] | None:
            return None if o is None else [o.window, o.step_seconds, o.bandwidth_bytes_per_s]

        return {
            "baseline": pack(self._baseline),
            "held_at": pack(self._held_at),
            "holds": self.holds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def unpack(v: list[float] | None) -> _Observation | None:
            return None if v is None else _Observation(int(v[0]), float(v[1]), float(v[2]))

        self._baseline = unpack(state.get("baseline"))
        self._held_at = unpack(state.get("held_at"))
        self.holds = int(state.get("holds", 0))
