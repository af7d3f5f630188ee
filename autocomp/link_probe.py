"""The active link probe: when, and how big, a dummy all-reduce should be to measure the link.

A plan that compresses hard leaves every step's transfers too small for the
:class:`~autocomp.link_model.BandwidthMeter` to see the bandwidth, so the estimate would
freeze. This module only decides the probe's size and schedule (pure bookkeeping, no
communication); the adaptive loop runs it at a window boundary and feeds the timing to the
meter with ``add_probe``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autocomp.compressors.base import Collective
from autocomp.link_model import LinkEstimate, latency_hops, link_bytes

__all__ = [
    "BOUNDARY_PROBE_PASSES",
    "PROBE_OVERRUN_FACTOR",
    "PROBE_OVERRUN_MIN_SECONDS",
    "PROBE_PASSES",
    "LinkProbe",
    "ProbePlan",
]

PROBE_PASSES = 2
"""All-reduces per probe: a priming pass, then the timed one. The first drains whatever a
token-bucket shaper lets through at line rate after an idle spell (tbf's bucket holds ~4 ms of
traffic) and reopens TCP's window, so the timed pass sees the sustained rate."""
BOUNDARY_PROBE_PASSES = 4
"""All-reduces of a probe at a window boundary: the priming pass, then three timed ones of
which the fastest counts (a rank's scheduling hiccup only ever adds time). With one timed
pass, the same 1 MiB probe on loopback read 225-1454 MB/s within single runs (mlp-lm
unshaped, thirty-second session); two slow readings in a row (225 and 263 MB/s at steps 200
and 250, against 1093 at the opening) told the payoff check the link had changed, and an fp16
plan that measured 1.2x the uncompressed step ran on until a correct reading (882 MB/s) at
step 350. The level probe keeps the fastest of three for the same reason."""
PROBE_OVERRUN_FACTOR = 3.0
"""A boundary probe whose priming pass took this many times the pass expected at the estimate
it was sized on (and ``PROBE_OVERRUN_MIN_SECONDS``) stops there, the priming pass its reading:
the link is several times slower than the estimate, so the remaining passes would cost that
many times their budget, and the priming pass already tells the estimate how wrong it is.
Sized at an opening that read a 10 Mbit/s link as 82 Mbit/s, the digits CNN's four passes
took 3.5 s of a 30 s run (fifty-eighth session). Smaller misses (a token bucket's burst
flattering a window's traffic 2x) keep every pass: the priming one alone reads them too
noisily to replace the estimate."""
PROBE_OVERRUN_MIN_SECONDS = 0.05
"""The least priming pass that ends a probe early: on a fast link a probe's passes take a few
ms, a scheduling hiccup can triple one, and the passes left cost next to nothing."""
_PROBE_LATENCY_MULTIPLE = 4.0
"""At the fastest rate it must resolve, a probe's transfer takes this many latency terms."""


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """Size and frequency of the active probe at the current estimate."""

    payload_bytes: int
    """Per-rank all-reduce payload (float32 elements x 4)."""
    every_windows: int
    """Probe once per this many blind windows of the length it was sized for, so the average
    cost stays in the budget (the schedule itself counts blind seconds: windows vary)."""
    seconds: float
    """Expected cost of one probe (all passes) at the current estimate."""


class LinkProbe:
    """When and how big an active link probe should be; pure bookkeeping, no communication.

    When the plan compresses hard, every step's transfers are too small for the meter (latency
    and per-call overhead dominate), so the estimate freezes at the rate that made the policy
    compress; if the link then gets faster, nothing would notice. A probe is one timed
    all-reduce of a dummy buffer at a window boundary, sized so that at the current estimate
    it costs ``budget`` of the window's wall time, yet large enough that on a link
    ``headroom`` times faster its transfer still stands clear of the latency. When the budget
    cannot buy that, the probe keeps its informative size and runs every few windows instead.
    Only blind windows (:attr:`~autocomp.link_model.BandwidthMeter.blind`) lead to probes.

    One probe is not rationed: the first window the meter closes under a new plan, if it
    comes back blind, is probed at once (:meth:`plan_changed`), warm-up or not. The decision
    that took the link out of the meter's view may rest on a reading that was too low (an
    early step's, with one-off costs in it), and nothing else can correct it: on the digits
    CNN on loopback, runs put a layer on fp16 at steps 1-4 on readings of 178-272 MB/s, and
    with a 10 ms step the budget bought the next probe 32 windows later, 1,400 steps of a
    slower plan (docs/benchmarks-history.md, "The link estimate frozen by the plan it chose"). A
    switch costs at most one such probe, and switches are rate-limited by the dwell rules.

    A switch made while the link has stayed out of view since a probe read it is not probed
    again: the estimate it rests on is that probe's, not a step's, and a later change of the
    link is the rationed schedule's to find. Every such probe costs four passes of about
    ``min_seconds x headroom`` (80 ms) each at the estimate whatever the rate, and on the
    digits CNN at 10 Mbit/s a plan moving between two compressed options every few windows
    had one after each move: four of 0.33 s in a 30 s run, against PyTorch's PowerSGD hook
    with none (docs/benchmarks-history.md, "A probe after every switch").

    Nor is a switch priced at about the rate the last probe read (at most ``vouched_within``
    below it): the confirmation would only read that link again. The opening's probe reads
    the link before any switch, and the first compressed plan is usually priced at its
    reading; its confirmation then cost 0.4-1.5 s of a 30 s run, since a probe's passes are
    sized to stand clear of 4x the latency at 20x the rate, and the fitted latency there is
    2-7 ms of per-call overhead on 2 busy cores (fifty-ninth session: the digits CNN at
    50 Mbit/s, the GPT LM at 50 and 200, the MLP LM at 200). A switch priced well below the
    probe's reading, an early step's one-off costs read as a slow link, is confirmed as before.

    The rationed schedule counts the blind windows' seconds, not the windows: a probe runs once
    ``budget`` of the blind time since the last one pays for it. Windows are not all alike: a
    settled plan's stretch makes them several times longer, and the early looks and a payoff
    baseline's windows shorter. Counted as windows against the last window's length, the
    digits ResNet at 100 Mbit/s (a 0.32 s probe, windows of 1-3 s) probed after 12 blind
    windows because the last one was stretched to 2.8 s, 17 s of blind time: 1.9% of it, not
    1% (docs/benchmarks-history.md, fifty-fifth session).
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Tuning of :class:`LinkProbe`."""

        budget: float = 0.01
        """Share of a window's wall time probes may cost on average at the estimate (0: off)."""
        headroom: float = 20.0
        """The probe must still measure a link this many times faster than the estimate."""
        min_seconds: float = 4e-3
        """Shortest transfer (at ``headroom`` x the estimate) a probe may take: timer and
        scheduling noise, and tbf's ~4 ms bucket, make shorter ones unreliable."""
        max_bytes: int = 64 << 20
        """Largest probe payload per rank (its buffer is kept for reuse)."""
        vouched_within: float = 1.25
        """A switch priced at a rate at most this factor below the last probe's reading rests
        on that probe, and is not probed again."""

        def __post_init__(self) -> None:
            if not (math.isfinite(self.budget) and self.budget >= 0):
                raise ValueError(f"probe budget must be finite and >= 0, got {self.budget}")
            if not self.headroom >= 1:
                raise ValueError(f"probe headroom must be >= 1, got {self.headroom}")
            if not self.min_seconds > 0 or self.max_bytes < 4:
                raise ValueError("probe min_seconds must be > 0 and max_bytes >= 4")
            if not self.vouched_within >= 1:
                raise ValueError(f"probe vouched_within must be >= 1, got {self.vouched_within}")

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or LinkProbe.Config()
        self._blind_seconds = 0.0
        """Wall time of the blind windows since the last probe or informative window."""
        self._unconfirmed = False
        """The plan changed and no window under it has been closed yet."""
        self._probed = False
        """A probe was asked for since the traffic last measured the link itself."""
        self._reading: float | None = None
        """Link bytes per second of the last probe taken (the opening's or a boundary's)."""

    def size(
        self, estimate: LinkEstimate, world_size: int, window_seconds: float
    ) -> ProbePlan | None:
        """The probe for a window of ``window_seconds`` at ``estimate``; None if none can run."""
        cfg = self.config
        allowed = cfg.budget * window_seconds
        hops = latency_hops(Collective.ALL_REDUCE, world_size)
        if hops == 0 or not (math.isfinite(allowed) and allowed > 0):
            return None
        per_payload_byte = link_bytes(Collective.ALL_REDUCE, 1, world_size)
        rate = estimate.bandwidth_bytes_per_s
        latency = hops * estimate.latency_s
        floor_seconds = max(cfg.min_seconds, _PROBE_LATENCY_MULTIPLE * latency)
        informative = floor_seconds * cfg.headroom * rate / per_payload_byte
        affordable = max(0.0, allowed / BOUNDARY_PROBE_PASSES - latency) * rate / per_payload_byte
        if affordable >= informative:  # round down: stay within the budget
            payload = 4 * math.floor(min(affordable, cfg.max_bytes) / 4)
        else:  # round up: stay informative (the cap wins over both)
            payload = min(4 * math.ceil(informative / 4), 4 * (cfg.max_bytes // 4))
        seconds = BOUNDARY_PROBE_PASSES * (latency + per_payload_byte * payload / rate)
        every = max(1, math.ceil(seconds / allowed - 1e-9))
        return ProbePlan(payload_bytes=payload, every_windows=every, seconds=seconds)

    def note_reading(self, bytes_per_s: float) -> None:
        """A probe (the opening's or a boundary's) read the link at ``bytes_per_s`` link bytes
        per second, latency included."""
        if math.isfinite(bytes_per_s) and bytes_per_s > 0:
            self._reading = float(bytes_per_s)

    def plan_changed(self, bandwidth_bytes_per_s: float | None = None) -> None:
        """The plan switched at this boundary, priced at ``bandwidth_bytes_per_s``: if the
        window it runs next comes back blind, that window is probed at once, unless a probe
        has read the link since the traffic last did, or the last probe's reading vouches
        for the rate the switch was priced at (see the class docstring)."""
        if self._probed or self._vouched(bandwidth_bytes_per_s):
            return
        self._unconfirmed = True

    def _vouched(self, bandwidth_bytes_per_s: float | None) -> bool:
        """Whether the last probe read the link no faster than ``vouched_within`` times the
        rate a switch was priced at: the confirmation could only read the same link again.
        (The probe's reading includes its latency, so it errs towards confirming.)"""
        if self._reading is None or bandwidth_bytes_per_s is None:
            return False
        return bandwidth_bytes_per_s * self.config.vouched_within >= self._reading

    def next_window(
        self,
        *,
        blind: bool,
        estimate: LinkEstimate | None,
        world_size: int,
        window_seconds: float,
        warming: bool = False,
        measured: bool = True,
    ) -> int:
        """Payload bytes to probe at the next boundary, 0 for none; call once per window.

        ``blind`` is whether the window just closed measured nothing by itself: informative
        traffic resets the count, so probes never run while the link is being measured
        anyway. ``warming``: a warm-up window, whose blindness comes from its few steps
        rather than from compression, so only the probe after a switch may run.
        ``measured``: whether the meter closed a window this time (it leaves one open until it
        holds enough samples, and ``blind`` is then the last closed window's); a switch waits
        for the first window that is.
        """
        unconfirmed = self._unconfirmed and measured
        if measured:
            self._unconfirmed = False
            if not blind:
                self._probed = False
        if not blind or estimate is None or self.config.budget <= 0:
            self._blind_seconds = 0.0
            return 0
        plan = self.size(estimate, world_size, window_seconds)
        if unconfirmed and plan is not None:
            self._blind_seconds = 0.0
            self._probed = True
            return plan.payload_bytes
        if warming:
            self._blind_seconds = 0.0
            return 0
        if math.isfinite(window_seconds) and window_seconds > 0:
            self._blind_seconds += window_seconds
        # Once the budget's share of the blind time pays for the probe (with equal windows,
        # every ``plan.every_windows``-th one).
        if plan is None or self._blind_seconds * self.config.budget < plan.seconds * (1 - 1e-9):
            return 0
        self._blind_seconds = 0.0
        self._probed = True
        return plan.payload_bytes

    def state_dict(self) -> dict[str, float]:
        return {
            "blind_seconds": self._blind_seconds,
            "unconfirmed": int(self._unconfirmed),
            "probed": int(self._probed),
            "reading": 0.0 if self._reading is None else self._reading,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        # A checkpoint from before the schedule counted seconds holds a window count
        # ("blind_windows"), which has no length: the count starts again.
        self._blind_seconds = float(state.get("blind_seconds", 0.0))
        self._unconfirmed = bool(state.get("unconfirmed", 0))
        self._probed = bool(state.get("probed", 0))
        reading = float(state.get("reading", 0.0))
        self._reading = reading if math.isfinite(reading) and reading > 0 else None
