"""The step gap: per-step time that the exposure model leaves out, measured and smoothed.

The model predicts a step as the compute-only step plus what communication adds
(:mod:`autocomp.exposure`). On short steps the measured step is longer by a few milliseconds
that no plan's prediction contains:

- the wait for the slower rank at the first collective;
- the hand-off between gloo's thread and the autograd thread;
- the spread between the window's fastest step (where the compute-only step is read) and
  its median.

The link meter leaves the first two out on purpose: it reads transfer times without the
ranks' skew. On the cnn task (2 gloo ranks, loopback) a comm hook that all-reduces one element
per bucket stepped about 2 ms slower than one that sends nothing, against a 4.7 ms
compute-only step (``docs/benchmarks-history.md``, "The predicted step against the measured one").
Uncompressed there, the model predicted 4.7-5.6 ms and the steps measured 7.6-8.3 ms.

The plans differ little in this cost, and every plan that sends anything pays it. So it
changes no plan's rank by predicted step. But the search works on ratios: the time slack is a
share of the fastest step, and progress per second divides by the step. Leaving the gap out
makes every time difference look up to twice its real share on such steps, and faster, lossier
plans look better than they are.

:class:`StepGap` takes the measured step of a window that ran one plan throughout, minus what
the model predicts for that plan (that window's compute-only step plus the added time the
decision predicted). The median of the last few such gaps is added to every plan's predicted
step (``StepTiming.sync_seconds``).

- A negative median counts as 0: on slow links the model over-predicts.
- The gap is capped at ``max_compute_share`` times the compute-only step. A large gap on a
  slow link is mostly a bandwidth miss, and that belongs to the plan, not to every plan.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["StepGap"]


class StepGap:
    """Median of recent measured-minus-predicted steps (seconds), clamped (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """How many gaps are kept, and the most a gap may count for."""

        samples: int = 5
        """Gaps in the median: the last few windows that ran one plan throughout."""
        max_compute_share: float = 0.5
        """The gap counts for at most this many compute-only steps."""

        def __post_init__(self) -> None:
            if self.samples < 1:
                raise ValueError(f"samples must be >= 1, got {self.samples}")
            if not self.max_compute_share >= 0:
                raise ValueError(f"max_compute_share must be >= 0, got {self.max_compute_share}")

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or StepGap.Config()
        self._gaps: deque[float] = deque(maxlen=self.config.samples)
        self._compute = 0.0

    def observe(self, measured_step: float, compute: float, predicted_added: float) -> None:
        """One window that ran the plan whose added time was predicted as ``predicted_added``:
        its (median) measured step and its compute-only step, seconds."""
        values = (measured_step, compute, predicted_added)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(
                f"step gap inputs must be finite and >= 0, got step {measured_step!r}, "
                f"compute {compute!r}, predicted added {predicted_added!r}"
            )
        self._gaps.append(measured_step - compute - predicted_added)
        self._compute = compute

    @property
    def raw_seconds(self) -> float | None:
        """The median gap before clamping (None before the first window)."""
        return statistics.median(self._gaps) if self._gaps else None

    @property
    def seconds(self) -> float:
        """What to add to every plan's predicted step: the median gap, clamped to
        [0, max_compute_share x the latest compute-only step]."""
        raw = self.raw_seconds
        if raw is None:
            return 0.0
        return min(max(0.0, raw), self.config.max_compute_share * self._compute)

    def state_dict(self) -> dict[str, Any]:
        return {"gaps": list(self._gaps), "compute": self._compute}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        gaps = [float(g) for g in state.get("gaps", [])]
        if not all(math.isfinite(g) for g in gaps):
            raise ValueError(f"step gap state holds a non-finite gap: {gaps!r}")
        self._gaps = deque(gaps, maxlen=self.config.samples)
        self._compute = float(state.get("compute", 0.0))
