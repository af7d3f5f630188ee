"""The dwell clock: a layer that changed compressor keeps it for a few windows.

Every switch resets warm starts (PowerSGD's Q) and error feedback pays a few steps of extra
error before the new compressor wins anything, while measured errors and step times are
noisy from window to window. So a layer that switched is locked on its new compressor for
``dwell_windows`` windows (the engine's ``dwell`` rule), unless

- the switch rested on a prior error (the compressor had never run on that layer) and the
  measurement came out clearly worse than that prior: the lock guards against noise, not
  against a wrong prior, so it is released (:attr:`DwellClock.released`);
- the link moved by ``link_change`` or more since the switch;
- the measured compute-only step moved by ``compute_change`` or more since the switch: a
  plan's worth is its time against the compute it hides behind and adds to, so a choice made
  on a 1.09 s compute is no choice for a 0.15 s one. The early looks read one or two steps,
  and whatever ran between steps (an evaluation, a slow first batch, one-off allocations)
  counts as compute there: on the GPT LM at 10 Mbit/s the look at step 2 read 1.09 s (the
  time-to-accuracy bench evaluates after each of the first, slow steps), put PowerSGD rank 16
  on two matrices, and the provisional lock held them against the look at step 4 (0.15 s)
  until step 50, at 0.285 s a step against 0.245 s;
- a guard forced the switch and has since lifted its back-off: the lock holds a choice, and
  a guard's choice lasts only as long as the guard (a critical regime on the digits CNN at
  10 Mbit/s ended at step 400, and the lock still held ``conv2`` on rank 4 until step 700);
- the switch was made at an early look (before the first full window), and this is the first
  full window's decision: a look measures a step or two whose compute still carries one-off
  costs, so it overstates what can hide behind the backward. On the MLP LM at 200 Mbit/s the
  look at step 2 (a 0.114 s step, 0.044 s later) moved ``out.weight`` from PowerSGD to fp16,
  predicted hidden; the lock kept it there to step 200 at 0.054 s a step, and the first
  unlocked decision moved it back (0.044 s). The look's plan is provisional: the first full
  window decides once, unlocked, and its own switches are locked as usual. So is a switch
  made inside the warm-up, which chose among the warm-up's few accurate options only: the
  decision that ends the warm-up decides it again (the caller passes ``settle`` there).

The engine drops the remaining locks when the locked plan's predicted progress per second
falls ``dwell_max_loss`` below the plan it would take without them at two decisions in a row
(the planner passes ``release_locks``: one window's timing noise is not a changed
situation); guards and pins win over locks there too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autocomp.link_model import bandwidth_moved

logger = logging.getLogger(__name__)

__all__ = ["DwellClock"]


@dataclass(frozen=True, slots=True)
class _Switch:
    """A layer's last change of compressor."""

    window: int
    """Window index of the decision."""
    bandwidth: float | None
    """Link estimate then (a big move since lifts the dwell)."""
    assumed_error: float | None = None
    """The prior relative error the switch rested on when the new compressor had never run on
    this layer, else None."""
    backoff: int = 0
    """The layer's guard back-off level when it switched (a lower level since lifts the lock)."""
    provisional: bool = False
    """Made at an early look or in the warm-up: locked only until the next decision that
    settles (a full window's, or the one that ends the warm-up)."""
    compute: float | None = None
    """The compute-only step the switch was priced on (a big move since lifts the dwell)."""


class DwellClock:
    """When each layer last switched, and which layers are still locked."""

    def __init__(
        self,
        *,
        dwell_windows: int,
        prior_miss: float,
        link_change: float,
        switch_margin: float,
        compute_change: float = 2.0,
    ) -> None:
        self.dwell_windows = dwell_windows
        self.prior_miss = prior_miss
        self.link_change = link_change
        self.compute_change = compute_change
        self.switch_margin = switch_margin
        self.changed_at: dict[str, _Switch] = {}
        """Layer -> its last switch."""
        self.released: set[str] = set()
        """Layers whose lock the last :meth:`locked` released early: a switch made on a prior
        error measured worse than that prior (``prior_miss``), or a provisional one."""

    def note(
        self,
        name: str,
        window: int,
        bandwidth: float | None,
        assumed_error: float | None,
        backoff: int = 0,
        provisional: bool = False,
        compute: float | None = None,
    ) -> None:
        """Start ``name``'s clock: it switched at ``window`` on a link of ``bandwidth`` and a
        compute-only step of ``compute`` seconds, under a guard back-off of ``backoff`` levels
        (``provisional``: at an early look)."""
        self.changed_at[name] = _Switch(
            window, bandwidth, assumed_error, backoff, provisional, compute
        )

    def locked(
        self,
        window: int,
        current: Mapping[str, str],
        bandwidth: float | None,
        measured_error: Callable[[str, str], float | None],
        backoff: Mapping[str, int],
        settle: bool = True,
        compute: float | None = None,
    ) -> dict[str, str]:
        """Layers still in their dwell at ``window``, with the spec they keep.

        ``measured_error(name, spec)`` is the smoothed measured relative error, or None;
        ``backoff`` the guards' level per layer now; ``settle``: this decision ends every
        provisional lock (it rests on a full window, not an early look, or it ends the
        warm-up); ``compute``: the compute-only step measured now (None: unknown).
        """
        locked = {}
        self.released = set()
        margin = 1.0 + self.switch_margin
        for name, switch in list(self.changed_at.items()):
            if window - switch.window >= self.dwell_windows:
                continue
            if switch.provisional and settle:
                del self.changed_at[name]  # the look's choice is decided again, once
                self.released.add(name)
                continue
            if backoff.get(name, 0) < switch.backoff:
                continue  # the guard that forced the switch has lifted
            measured = measured_error(name, current[name])
            assumed = switch.assumed_error
            if (
                assumed is not None
                and measured is not None
                and measured > assumed * margin
                and measured - assumed >= self.prior_miss
            ):  # the prior was too hopeful: free to correct it
                self.released.add(name)
                logger.debug(
                    "autocomp: %s: %s measured %.3g against its prior %.3g; dwell released",
                    name,
                    current[name],
                    measured,
                    assumed,
                )
                continue
            then = switch.bandwidth
            moved = (
                then is not None
                and bandwidth is not None
                and bandwidth_moved(then, bandwidth, self.link_change)
            )
            was, now = switch.compute, compute
            compute_moved = (
                was is not None
                and now is not None
                and was > 0
                and now > 0
                and bandwidth_moved(was, now, self.compute_change)  # the same ratio test
            )
            if moved or compute_moved:
                logger.debug(
                    "autocomp: %s: the %s since its switch moved; dwell lifted",
                    name,
                    "link" if moved else f"compute-only step ({was:.3g} s -> {now:.3g} s)",
                )
                continue
            locked[name] = current[name]
        return locked

    def state_dict(self) -> dict[str, Any]:
        return {
            name: [s.window, s.bandwidth, s.assumed_error, s.backoff, s.provisional, s.compute]
            for name, s in self.changed_at.items()
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.changed_at = {
            str(name): _Switch(
                int(v[0]),
                None if v[1] is None else float(v[1]),
                None if len(v) < 3 or v[2] is None else float(v[2]),
                int(v[3]) if len(v) > 3 else 0,
                bool(v[4]) if len(v) > 4 else False,
                None if len(v) < 6 or v[5] is None else float(v[5]),
            )
            for name, v in state.items()
        }
