"""What the convergence guards can say: guard names, actions and the event record.

Kept apart from the decision logic in :mod:`autocomp.guards`: events are what the run log and
checkpoints store, and the sidecar's metrics count them by these names without needing the
guards themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["GUARD_NAMES", "GuardEvent"]

WARMUP = "warmup"
NONFINITE = "nonfinite"
LOSS_DIVERGENCE = "loss_divergence"
CRITICAL_REGIME = "critical_regime"
RESIDUAL_GROWTH = "residual_growth"
RECOVERED = "recovered"
LOSS_SCALE = "loss_scale"
GUARD_NAMES = (
    WARMUP,
    NONFINITE,
    LOSS_DIVERGENCE,
    CRITICAL_REGIME,
    RESIDUAL_GROWTH,
    RECOVERED,
    LOSS_SCALE,
)
"""Every value ``GuardEvent.guard`` can take."""

ACTION_ENABLE = "enable compression"
ACTION_RESUME_WARMUP = "warm-up resumed"
ACTION_UNCOMPRESSED_RESET = "uncompressed step + EF reset"
ACTION_RESET = "EF reset"
ACTION_IGNORED = "ignored"
ACTION_BACK_OFF = "back off 1 level"
ACTION_BACK_OFF_ALL = "back off 1 level on every layer"
ACTION_AT_MAX = "none: back-off already at max"
ACTION_CRITICAL_HOLDS = "none: critical regime goes on (one level)"
ACTION_RESET_BACK_OFF = "EF reset + back off 1 level"
ACTION_RESET_AT_MAX = "EF reset (back-off already at max)"
ACTION_RESET_ONLY = "EF reset (already backed off this window)"
ACTION_RECOVER = "recover 1 level"
ACTION_RESCALED = "gradient-norm references rescaled"


@dataclass(frozen=True, slots=True)
class GuardEvent:
    """One guard decision, kept for inspection, logs and checkpoints."""

    step: int
    """Step the observation that fired belongs to."""
    guard: str
    """Which guard fired: one of :data:`GUARD_NAMES`."""
    layer: str | None
    """Parameter name, or None for decisions about the whole model."""
    detail: str
    """Human-readable numbers behind the decision."""
    action: str
    """What the controller must do, e.g. ``"back off 1 level"``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "guard": self.guard,
            "layer": self.layer,
            "detail": self.detail,
            "action": self.action,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GuardEvent:
        layer = data["layer"]
        return cls(
            step=int(data["step"]),
            guard=str(data["guard"]),
            layer=None if layer is None else str(layer),
            detail=str(data["detail"]),
            action=str(data["action"]),
        )
