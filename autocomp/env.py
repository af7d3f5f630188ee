"""Environment overrides, declared once with their types (``AUTOCOMP_*``).

Read at the moment they are needed, so a launcher or a test can set them per process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T", int, float, bool, str)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True, slots=True)
class EnvVar(Generic[T]):
    """A typed environment variable with a default."""

    name: str
    """Variable name, always ``AUTOCOMP_*``."""
    default: T
    """Value when unset."""
    doc: str
    """What it changes."""

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        kind = type(self.default)
        if kind is bool:
            word = raw.strip().lower()
            if word in _TRUE:
                return True  # type: ignore[return-value]
            if word in _FALSE:
                return False  # type: ignore[return-value]
            raise ValueError(f"{self.name}={raw!r}: expected one of 1/0/true/false/yes/no/on/off")
        try:
            return kind(raw)  # type: ignore[return-value]
        except ValueError:
            raise ValueError(f"{self.name}={raw!r}: expected {kind.__name__}") from None


AUTOCOMP_SEED = EnvVar(
    "AUTOCOMP_SEED", 0, "Base seed of shared random choices (randomk, PowerSGD)."
)
AUTOCOMP_DISABLE = EnvVar(
    "AUTOCOMP_DISABLE", False, "Kill switch: every layer uses plain all-reduce, plan ignored."
)
AUTOCOMP_CHECK_WIRE_BYTES = EnvVar(
    "AUTOCOMP_CHECK_WIRE_BYTES",
    True,
    "Verify every payload's size against its compressor's wire_bytes (cheap integer check).",
)
AUTOCOMP_RUN_DIR = EnvVar(
    "AUTOCOMP_RUN_DIR", "", "Parent directory of run logs (default ./autocomp-runs)."
)
AUTOCOMP_NODE_LINK_MIN_ADVANTAGE = EnvVar(
    "AUTOCOMP_NODE_LINK_MIN_ADVANTAGE",
    4.0,
    "hierarchy='auto' reduces in two levels only when the link inside a node measures at least "
    "this many times faster than the one between nodes (timed at wrap); 0 decides on the "
    "topology alone. The adaptive loop warns at the same ratio later in the run.",
)
AUTOCOMP_TOKEN = EnvVar(
    "AUTOCOMP_TOKEN", "", "Bearer token for the sidecar's overrides (default: generated)."
)

AUTOCOMP_RECORD_WINDOWS = EnvVar(
    "AUTOCOMP_RECORD_WINDOWS",
    "",
    "Rank 0 appends the opening's link probe and every window's measurement, the plan that "
    "ran and the decision it led to, to this JSON-lines file, so the planner's decisions can "
    "be replayed offline (debugging, regression tests).",
)
