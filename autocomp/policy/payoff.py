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
comes first. Then the engine may try again. A try that fails again on the same link holds
twice as long as the last (up to 8x): each try costs a few compressed windows.

The same errors decide between two compressed plans: the engine keeps a plan whose
predicted step is within ``time_slack`` of the fastest one, and on two cores a plan that sends
more bytes (gloo's transfer threads take the backward's core) can be predicted within the slack
and measure 5-15% slower (GPT LM at 10 and 50 Mbit/s, docs/benchmarks-history.md). So the check also
keeps a ledger of settled compressed plans: each one's last ``ledger_windows`` window medians,
on the current link. When the plan in use measures more than ``revert_slack`` slower than the
fastest plan in the ledger (medians), and each of its windows slower than each of that plan's
(so that the noise of a few percent between windows never reverts), the engine is sent back
to that plan for ``hold_windows`` windows (or until the link moves): measured, the faster
plan is the only one known to meet the slack.

A compressed plan's own traffic can move the link estimate: on a fast link its few small
transfers are dominated by per-call overhead and by the compression work on the same cores
(the MLP LM on loopback read 7 Gbit/s uncompressed and 2 Gbit/s once two layers were on
PowerSGD), so "bandwidth within ``link_change``" would void every comparison exactly where
compression pays least. The idle link settles it: a link probe taken while uncompressed (the
opening's, or any later one) is the reference, and when a compressed window's estimate has
moved from the baseline's, the check asks for a probe of the same size at the next boundary
(:meth:`probe_wanted`). If that probe reads within ``link_change`` of the reference, the link
did not change and the window is compared with the baseline after all; the hold then
remembers the baseline's link, which the uncompressed windows that follow will measure.

A run that compressed from its first steps (the opening or the glance at step 1 chose a
plan) has no uncompressed window to compare with, and the check could never fire. The
digits ResNet at 200 Mbit/s (0.17 MB of gradients a step) compressed from step 1, predicted
17.7 ms a step against 22.3 ms uncompressed, and stepped 1.11x slower than plain DDP for the
whole run (thirty-third session). So when a settled compressed window finds no baseline and
the plan that ran was predicted to save less than ``baseline_gain`` of the uncompressed step,
the optimizer's layers are held uncompressed for ``baseline_windows`` windows, once, to measure
one; the check then judges the compressed plan that follows as usual (the planner holds that
decision to the plan the hold interrupted, with the engine's hysteresis). A plan predicted to
save more (a slow link) is not worth measuring against: the windows would cost more than a
wrong bet there could.

Those windows are short (:meth:`PayoffCheck.baseline_window_steps`): ``BASELINE_SETTLE_STEPS``
for the one that takes the switch, ``baseline_steps`` for each one measured. Regular windows
made the baseline cost 100 uncompressed steps of a 50-step window where compression paid: on
the GPT LM at 1 Gbit/s (30 s, 163 steps in all) 2.3594 against 2.2631 for PyTorch's fp16
hook, and 100 of the MLP LM's 241 steps at 0.146 s against 0.097 compressed (thirty-fourth
session). A window's step time is the median of its steps, so 16 of them measure it as well
as the 50-step window that it is compared with measures its own to a few percent.

Judging near the noise. On a shared machine a window's median step moves by 5-7% from one
window to the next with nothing changed (the digits ViT at 500 Mbit/s, uncompressed for the
last 300 steps of a run: 83-98 ms), so one window against one baseline cannot tell a 6% gain
from none, and a plan is judged again at every settled window. fp16 on every tensor of that
ViT steps 0.94x plain DDP when the modes alternate step by step (autocomp uncompressed:
0.99x), yet 10 of the fifty-first session's 14 runs held their fp16 plans off at the first
judgement after the baseline, each for the rest of the run (docs/benchmarks-history.md,
fifty-second session). Three rules bring the check closer to the gain:

- the plan's side of the comparison is the median of its settled windows since it last
  started (the current stretch, up to ``ledger_windows`` of them), not the latest one;
- a plan whose error costs no per-step progress (``required_gain`` under
  ``LOSSLESS_REQUIRED_GAIN``: fp16 and bf16 casts price at about 1e-8) must measure only
  ``lossless_min_gain`` faster. For it a wrong pass costs the windows until the next
  judgement, of a plan no worse per step, while a wrong hold costs ``hold_windows`` windows
  of its gain; ``min_gain`` stays the bar of a lossy plan, whose pass trades progress;
- a miss by a plan that still measured faster than the baseline has the uncompressed step
  measured again (the short baseline windows) before it holds, as a plan that paid already
  does; a plan that measured slower than the baseline holds at once.

A simulation of this class under 5% lognormal window noise with a planner that always wants
the compressed plan (docs/benchmarks-matrix-2026-12-01/session-52/paysim.py) gives the share
of the ideal gain each version keeps: for a plan 6% faster, 62% over 13 windows and 52% over
100 before, 77% and 85% after; for a plan 5% slower, the throughput lost over 100 windows
goes from 0.8% to 1.1% (a plan measured faster by chance is measured again before its hold).

Rank 0 runs it (it decides); its state is part of the controller's checkpoint.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any

from autocomp.link_model import bandwidth_moved

logger = logging.getLogger(__name__)

__all__ = ["BASELINE_SETTLE_STEPS", "LOSSLESS_REQUIRED_GAIN", "PayoffCheck", "gain_bar"]

BASELINE_SETTLE_STEPS = 2
"""Steps of the first window held uncompressed for a baseline: it is not compared (its first
step pays the switch), so it only has to end, with the norms of its sampled steps read."""

LOSSLESS_REQUIRED_GAIN = 1e-3
"""A plan whose compression error the engine prices under this share of a step's progress
(``PolicyDecision.required_gain``) counts as lossless for the bar. fp16 and bf16 casts price
at about 1e-8 and 1e-6, int8 with error feedback about 3e-5; one matrix on PowerSGD rank 4
among fp16 ones already prices at 2.4e-3 (the digits ViT)."""


def gain_bar(required_gain: float, min_gain: float, lossless_min_gain: float) -> float:
    """The share of the uncompressed step a compressed plan must save, measured (the payoff
    check) or predicted after a hold (``PolicyEngine``): the progress its error costs, and at
    least the noise floor, ``lossless_min_gain`` for a plan whose error costs nothing."""
    floor = lossless_min_gain if required_gain < LOSSLESS_REQUIRED_GAIN else min_gain
    return max(floor, required_gain)


@dataclass(slots=True)
class _Observation:
    window: int
    step_seconds: float
    bandwidth_bytes_per_s: float


@dataclass(slots=True)
class _PlanSteps:
    """Settled window medians of one compressed plan, on one link."""

    steps: list[float]
    bandwidth_bytes_per_s: float
    window: int
    """The latest window measured."""

    @property
    def median(self) -> float:
        return statistics.median(self.steps)


class PayoffCheck:
    """Holds compression off where a compressed window measured no faster than an
    uncompressed one on the same link (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """When a compressed plan counts as paying off, and how long a hold lasts."""

        min_gain: float = 0.05
        """A compressed window must be this much faster than the uncompressed baseline."""
        lossless_min_gain: float = 0.03
        """The same for a plan whose error costs no progress (see ``LOSSLESS_REQUIRED_GAIN``);
        the planner sets the policy's ``time_slack``, within which plans count as equally
        fast."""
        hold_windows: int = 10
        """Windows a hold lasts before the engine may try compression again."""
        link_change: float = 2.0
        """Bandwidth ratio that makes a baseline or a hold stale (the link changed)."""
        revert_slack: float = 0.03
        """A compressed plan measured this much slower than the fastest measured one is
        reverted (the engine's ``time_slack``: within it, plans count as equally fast)."""
        ledger_windows: int = 4
        """Settled windows per plan the ledger compares (medians, and their ranges); a plan
        with fewer is not judged, so a revert never follows a switch within ``4 + 1``
        windows (the first window after a switch is not settled)."""
        ledger_plans: int = 8
        """Plans the ledger remembers (the least recently measured is dropped)."""
        baseline_gain: float = 0.25
        """A compressed plan predicted to save less than this share of the uncompressed step
        is measured against an uncompressed baseline when none exists (0: never)."""
        baseline_windows: int = 2
        """Windows held uncompressed to measure that baseline (the first is not settled)."""
        baseline_steps: int = 16
        """Steps of each baseline window after the first (which takes the switch in
        ``BASELINE_SETTLE_STEPS``); 0: the regular window."""

        def __post_init__(self) -> None:
            if not 0.0 <= self.min_gain < 1.0:
                raise ValueError(f"min_gain must be in [0, 1), got {self.min_gain}")
            if not 0.0 <= self.lossless_min_gain <= self.min_gain:
                raise ValueError(
                    f"lossless_min_gain must be in [0, min_gain], got {self.lossless_min_gain}"
                )
            if self.hold_windows < 1:
                raise ValueError(f"hold_windows must be >= 1, got {self.hold_windows}")
            if not self.link_change > 1.0:
                raise ValueError(f"link_change must be > 1, got {self.link_change}")
            if not 0.0 <= self.revert_slack < 1.0:
                raise ValueError(f"revert_slack must be in [0, 1), got {self.revert_slack}")
            if self.ledger_windows < 1 or self.ledger_plans < 2:
                raise ValueError("need ledger_windows >= 1 and ledger_plans >= 2")
            if not 0.0 <= self.baseline_gain < 1.0:
                raise ValueError(f"baseline_gain must be in [0, 1), got {self.baseline_gain}")
            if self.baseline_windows < 2:
                raise ValueError(
                    f"baseline_windows must be >= 2 (one settled window), got "
                    f"{self.baseline_windows}"
                )
            if self.baseline_steps != 0 and self.baseline_steps < BASELINE_SETTLE_STEPS:
                raise ValueError(
                    f"baseline_steps must be 0 (the regular window) or >= "
                    f"{BASELINE_SETTLE_STEPS}, got {self.baseline_steps}"
                )

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or PayoffCheck.Config()
        self._baseline: _Observation | None = None
        self._held_at: _Observation | None = None
        self.holds = 0
        """Holds started so far."""
        self.last_gain: float | None = None
        """Measured gain of the latest compressed window against its baseline, if any."""
        self._ledger: dict[tuple[str, ...], _PlanSteps] = {}
        self._revert: tuple[tuple[str, ...], _Observation] | None = None
        self.reverts = 0
        """Reverts to a faster measured plan started so far."""
        self._hold_length = self.config.hold_windows
        """Windows the current (or last) hold lasts: doubled for each hold in a row on the
        same link, up to 8x (a retry that fails again costs its windows again)."""
        self._expired_link: float | None = None
        """The link a hold expired on (not ended by a link move), to tell a repeat."""
        self._reference_probe: tuple[int, float] | None = None
        """(payload bytes, bytes/s) of the latest link probe taken while uncompressed."""
        self._probe_wanted = False
        self._baseline_left = 0
        """Decisions that still hold the optimizer's layers uncompressed for a baseline."""
        self._seeking = False
        """Whether the latest :meth:`hold_reason` held them for the baseline."""
        self.baseline_sought = False
        """Whether a baseline was measured on purpose (at most once a run)."""
        self._measured: dict[tuple[str, ...], None] = {}
        """Compressed plans that measured their gain over the baseline (newest last)."""
        self._rechecked: set[tuple[str, ...]] = set()
        """Plans of ``_measured`` that missed the bar once and wait for a new baseline."""
        self.rechecks = 0
        """Baselines measured again because a plan missed the bar by less than the noise."""
        self._stretch: tuple[tuple[str, ...], list[float]] | None = None
        """The compressed plan of the latest judged windows and its settled window medians
        since it last started (see the module docstring)."""

    def note_probe(self, payload_bytes: int, bytes_per_s: float, compressed: bool) -> None:
        """A link probe's reading; one taken while nothing was compressed is the reference
        that tells a real link change from a compressed plan's own traffic."""
        if compressed or not (math.isfinite(bytes_per_s) and bytes_per_s > 0):
            return
        if payload_bytes > 0:
            self._reference_probe = (int(payload_bytes), float(bytes_per_s))

    def watch(self, bandwidth: float | None) -> None:
        """A compressed window that is not settled yet (the first after a switch): when its
        estimate moved from the baseline's, ask for the probe now, so that the first settled
        window arrives with it and is compared at once."""
        base = self._baseline
        if bandwidth is None or base is None or self._reference_probe is None:
            return
        if not self._similar(base.bandwidth_bytes_per_s, bandwidth):
            self._probe_wanted = True

    @property
    def reference_probe_bytes(self) -> int:
        """Payload bytes of the reference probe (0: none taken while uncompressed yet)."""
        return 0 if self._reference_probe is None else self._reference_probe[0]

    def probe_agrees(self, bytes_per_s: float | None) -> bool | None:
        """Whether a probe reads the link within ``link_change`` of the reference probe
        (None: no probe, or no reference to compare with)."""
        if bytes_per_s is None or self._reference_probe is None:
            return None
        return self._similar(self._reference_probe[1], bytes_per_s)

    def probe_wanted(self) -> int:
        """Payload bytes of the probe to run at the next boundary (0: none); asked once."""
        wanted, self._probe_wanted = self._probe_wanted, False
        if not wanted or self._reference_probe is None:
            return 0
        return self._reference_probe[0]

    def _similar(self, a: float, b: float) -> bool:
        return not bandwidth_moved(a, b, self.config.link_change)

    def observe(
        self,
        window: int,
        compressed: bool,
        step_seconds: float,
        bandwidth: float | None,
        plan: tuple[str, ...] | None = None,
        required_gain: float = 0.0,
        probe_bytes_per_s: float | None = None,
        predicted_gain: float | None = None,
    ) -> str | None:
        """Record one window's median step under the plan it ran; a note when a hold or a
        revert starts.

        ``required_gain``: the gain the engine required of this plan for the per-step
        progress its compression error costs (``PolicyDecision.required_gain``); the window
        must measure at least the larger of it and ``min_gain`` faster than the baseline.
        ``probe_bytes_per_s``: the reading of a link probe taken at the end of this window,
        if any (see the module docstring). ``predicted_gain``: the share of the uncompressed
        step the plan that ran was predicted to save (None: unknown), which decides whether a
        missing baseline is measured.

        ``compressed``: whether the optimizer compressed any layer during the window (rule
        decisions such as pins count as neither). ``plan``: every layer's spec, for the
        ledger of compressed plans (None: not kept).
        """
        if bandwidth is None or not (math.isfinite(step_seconds) and step_seconds > 0):
            return None
        observation = _Observation(window, step_seconds, bandwidth)
        if not compressed:
            self._baseline = observation
            self._stretch = None
            return None
        pooled = self._pool(plan, step_seconds)
        if self._baseline is None:
            sought = self._seek_baseline(observation, predicted_gain)
            if sought is not None:
                return sought
        may_recheck = plan is not None and plan not in self._rechecked
        paid = plan is not None and plan in self._measured
        held = self._against_baseline(
            observation, pooled, required_gain, probe_bytes_per_s, may_recheck, paid
        )
        if plan is not None:
            if held is not None and self._baseline_left > 0:  # measured again, not held
                self._rechecked.add(plan)
                return held
            self._measured.pop(plan, None)
            self._rechecked.discard(plan)
            if held is None and self.last_gain is not None:  # compared, and it paid
                self._measured[plan] = None
                while len(self._measured) > self.config.ledger_plans:
                    del self._measured[next(iter(self._measured))]
        if held is not None or plan is None:
            return held
        return self._against_ledger(plan, observation)

    def _pool(self, plan: tuple[str, ...] | None, step_seconds: float) -> tuple[float, int]:
        """(median, windows) of the plan's settled windows in its current stretch, this one
        included; a window of an unnamed plan stands alone."""
        if plan is None:
            self._stretch = None
            return step_seconds, 1
        if self._stretch is None or self._stretch[0] != plan:
            self._stretch = (plan, [])
        steps = self._stretch[1]
        steps.append(step_seconds)
        del steps[: -self.config.ledger_windows]
        return statistics.median(steps), len(steps)

    def _seek_baseline(self, observation: _Observation, predicted_gain: float | None) -> str | None:
        cfg = self.config
        if self.baseline_sought or predicted_gain is None or predicted_gain >= cfg.baseline_gain:
            return None
        self.baseline_sought = True
        self._baseline_left = cfg.baseline_windows
        note = (
            f"no uncompressed window measured yet, and the plan in use was predicted to save "
            f"only {predicted_gain:.1%} of the step (under baseline_gain "
            f"{cfg.baseline_gain:.0%}); uncompressed for {cfg.baseline_windows} windows to "
            "measure it"
        )
        logger.info("autocomp: %s", note)
        return note

    def compression_measured(self, plan: tuple[str, ...]) -> bool:
        """False once a compressed plan has measured no payoff on this run (a hold), until
        ``plan`` (every layer's spec) measures at least the gain it owed over an uncompressed
        window: meanwhile the engine must predict ``min_gain`` for any compressed plan
        (``PolicyEngine.decide``'s ``compression_measured``).

        Before any hold the predictions stand. Where they err low, a floor costs the whole
        run: at 1 Gbit/s (tbf lets its bucket through at veth speed between steps, so the
        meter reads the link faster than it is) the GPT LM's fp16 was predicted to save 4.1%
        and 4.9% of the step, measured 13% (PyTorch's fp16 hook, 0.152 s against 0.172), and
        one run of three stayed uncompressed to its end (138 steps, loss 2.4107 against
        2.2824 for the hook; thirty-fourth session). Where they err high, the bet costs the
        windows until its first settled one is judged."""
        return self.holds == 0 or plan in self._measured

    def seeking_baseline(self) -> bool:
        """Whether the latest decision held the optimizer's layers uncompressed to measure a
        baseline (a switch made for it is not a choice to dwell on)."""
        return self._seeking

    def baseline_window_steps(self) -> int:
        """Steps of the window after the latest decision when it is a baseline window, else 0
        (the regular schedule): the first one only takes the switch."""
        if not self._seeking or self.config.baseline_steps == 0:
            return 0
        first = self._baseline_left == self.config.baseline_windows - 1
        return BASELINE_SETTLE_STEPS if first else self.config.baseline_steps

    def _against_ledger(self, plan: tuple[str, ...], observation: _Observation) -> str | None:
        cfg = self.config
        bandwidth = observation.bandwidth_bytes_per_s
        # Only plans measured on a similar link compare (and the ledger stays small).
        self._ledger = {
            key: entry
            for key, entry in self._ledger.items()
            if self._similar(entry.bandwidth_bytes_per_s, bandwidth)
        }
        entry = self._ledger.pop(plan, None)
        if entry is None:
            entry = _PlanSteps([], bandwidth, observation.window)
        entry.steps = [*entry.steps, observation.step_seconds][-cfg.ledger_windows :]
        entry.bandwidth_bytes_per_s, entry.window = bandwidth, observation.window
        self._ledger[plan] = entry  # newest last
        while len(self._ledger) > cfg.ledger_plans:
            del self._ledger[next(iter(self._ledger))]
        full = cfg.ledger_windows
        fastest_plan, fastest = min(
            ((k, e) for k, e in self._ledger.items() if len(e.steps) >= full),
            key=lambda item: item[1].median,
            default=(plan, entry),
        )
        slower = (
            fastest_plan != plan
            and len(entry.steps) >= full
            and entry.median > fastest.median * (1 + cfg.revert_slack)
            # Separated, not just apart on average: every window of the plan in use slower
            # than every window of the faster plan (noise of a few percent never reverts).
            and min(entry.steps) > max(fastest.steps)
        )
        if not slower:
            return None
        self._revert = (fastest_plan, observation)
        self.reverts += 1
        note = (
            f"the plan in use measured {entry.median * 1e3:,.1f} ms/step, "
            f"{entry.median / fastest.median - 1:.1%} slower than the plan of window "
            f"{fastest.window} ({fastest.median * 1e3:,.1f} ms, over the "
            f"{cfg.revert_slack:.0%} slack); back to that plan for up to {cfg.hold_windows} "
            "windows"
        )
        logger.info("autocomp: %s", note)
        return note

    def _against_baseline(
        self,
        observation: _Observation,
        pooled: tuple[float, int],
        required_gain: float,
        probe: float | None,
        may_recheck: bool,
        paid: bool,
    ) -> str | None:
        """Judge the plan's pooled step against the baseline: None when it pays (or cannot
        be compared), else the note of a hold or of a baseline measured again (``paid``: the
        plan paid on this link before, and any miss of it is measured again)."""
        step_seconds, windows = pooled
        bandwidth = observation.bandwidth_bytes_per_s
        base = self._baseline
        self.last_gain = None
        if base is None:
            return None
        held_link = bandwidth
        if not self._similar(base.bandwidth_bytes_per_s, bandwidth):
            reference = self._reference_probe
            if reference is None:
                return None  # no idle-link reading to tell the link from the plan
            if probe is None:
                self._probe_wanted = True
                return None
            if not self._similar(reference[1], probe):
                return None  # the idle link itself moved: the baseline is stale
            # The link is as it was; only the plan's traffic reads it differently. A hold
            # ends when the link moves from the baseline's, as uncompressed windows see it.
            held_link = base.bandwidth_bytes_per_s
        gain = 1.0 - step_seconds / base.step_seconds
        self.last_gain = gain
        cfg = self.config
        bar = gain_bar(required_gain, cfg.min_gain, cfg.lossless_min_gain)
        if gain >= bar:
            self._expired_link = None
            self._hold_length = self.config.hold_windows
            return None
        if may_recheck and (paid or gain > 0.0):
            return self._measure_baseline_again(step_seconds, windows, base, gain, bar, paid)
        repeat = self._expired_link is not None and self._similar(self._expired_link, held_link)
        self._hold_length = min(
            8 * self.config.hold_windows,
            2 * self._hold_length if repeat else self.config.hold_windows,
        )
        self._held_at = _Observation(observation.window, step_seconds, held_link)
        self.holds += 1
        note = (
            f"compression measured no payoff: {step_seconds * 1e3:,.0f} ms/step compressed"
            f"{_over(windows)} vs {base.step_seconds * 1e3:,.0f} ms uncompressed (window "
            f"{base.window}) on a {bandwidth * 8 / 1e6:,.0f} Mbit/s link, gain {gain:.1%} < "
            f"{bar:.1%} (min_gain {cfg.min_gain:.0%}, {cfg.lossless_min_gain:.0%} for a "
            f"lossless plan, or the progress the plan's error costs); uncompressed for up to "
            f"{self._hold_length} windows"
        )
        logger.info("autocomp: %s", note)
        return note

    def _measure_baseline_again(
        self,
        step_seconds: float,
        windows: int,
        base: _Observation,
        gain: float,
        bar: float,
        paid: bool,
    ) -> str:
        """A plan that paid on this link, or one that measured faster than the baseline but
        under the bar, missed once: measure the uncompressed step again (the short baseline
        windows) and judge the plan against that before any hold.

        The baseline is the latest uncompressed window, which can be hundreds of steps old,
        and a shared machine drifts. On the GPT LM at 1 Gbit/s (120 s, thirty-fifth session)
        fp16 everywhere measured 0.153 s a step against a baseline of 0.172, then 0.166 in
        a window where the machine had slowed down (the uncompressed windows after it read
        0.174-0.191): 3.5% against the old baseline, under ``min_gain``, and the hold kept
        the run uncompressed for its last 470 steps. A gain between 0 and the bar is within
        the windows' noise whether or not the plan paid before (see the module docstring).
        A second miss, against the fresh baseline, holds as before."""
        self._baseline_left = self.config.baseline_windows
        self.rechecks += 1
        who = "a plan that paid on this link" if paid else "a plan faster than uncompressed"
        note = (
            f"{who} measured {step_seconds * 1e3:,.0f} ms/step{_over(windows)} against "
            f"{base.step_seconds * 1e3:,.0f} ms uncompressed (window {base.window}), gain "
            f"{gain:.1%} < {bar:.1%}: the uncompressed step is measured again before the plan "
            "is judged (a second miss holds)"
        )
        logger.info("autocomp: %s", note)
        return note

    def hold_reason(self, window: int, bandwidth: float | None) -> str | None:
        """Why the optimizer's layers stay uncompressed at this window, or None (once per
        decision: a baseline hold counts its windows here)."""
        self._seeking = self._baseline_left > 0
        if self._seeking:
            self._baseline_left -= 1
            left = self._baseline_left
            why = (
                "a plan missed the bar by less than the noise"
                if self._rechecked
                else "none measured yet, and the compressed plan was predicted to save under "
                f"{self.config.baseline_gain:.0%} of the step"
            )
            return (
                f"measuring an uncompressed baseline ({why}): "
                f"{left + 1} window{'s' if left else ''} more"
            )
        held = self._held_at
        if held is None:
            return None
        expired = window - held.window >= self._hold_length
        # In the window it started the hold was judged on this very estimate.
        moved = (
            window > held.window
            and bandwidth is not None
            and not self._similar(held.bandwidth_bytes_per_s, bandwidth)
        )
        if expired or moved:
            self._held_at = None
            self._expired_link = held.bandwidth_bytes_per_s if not moved else None
            if moved:
                self._hold_length = self.config.hold_windows
            return None
        return (
            f"compression measured no payoff at window {held.window} "
            f"({held.step_seconds * 1e3:,.0f} ms/step compressed vs the uncompressed "
            f"baseline, a gain under min_gain {self.config.min_gain:.0%}, "
            f"{self.config.lossless_min_gain:.0%} for a lossless plan, or the progress its "
            "error costs); held off until "
            f"window {held.window + self._hold_length} or a "
            f"{self.config.link_change:g}x link change"
        )

    def revert_plan(self, window: int, bandwidth: float | None) -> tuple[str, ...] | None:
        """The faster measured plan the engine must return to at this window, or None."""
        if self._revert is None:
            return None
        plan, at = self._revert
        expired = window - at.window >= self.config.hold_windows
        moved = bandwidth is not None and not self._similar(at.bandwidth_bytes_per_s, bandwidth)
        if expired or moved:
            self._revert = None
            return None
        return plan

    def state_dict(self) -> dict[str, Any]:
        def pack(o: _Observation | None) -> list[float] | None:
            return None if o is None else [o.window, o.step_seconds, o.bandwidth_bytes_per_s]

        return {
            "baseline": pack(self._baseline),
            "held_at": pack(self._held_at),
            "holds": self.holds,
            "ledger": [
                [list(plan), list(e.steps), e.bandwidth_bytes_per_s, e.window]
                for plan, e in self._ledger.items()
            ],
            "revert": None
            if self._revert is None
            else [list(self._revert[0]), pack(self._revert[1])],
            "reverts": self.reverts,
            "hold_length": self._hold_length,
            "expired_link": self._expired_link,
            "reference_probe": None
            if self._reference_probe is None
            else list(self._reference_probe),
            "baseline_left": self._baseline_left,
            "seeking": self._seeking,
            "baseline_sought": self.baseline_sought,
            "measured": [list(plan) for plan in self._measured],
            "rechecked": [list(plan) for plan in self._rechecked],
            "rechecks": self.rechecks,
            "stretch": None
            if self._stretch is None
            else [list(self._stretch[0]), list(self._stretch[1])],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def unpack(v: list[float] | None) -> _Observation | None:
            return None if v is None else _Observation(int(v[0]), float(v[1]), float(v[2]))

        self._baseline = unpack(state.get("baseline"))
        self._held_at = unpack(state.get("held_at"))
        self.holds = int(state.get("holds", 0))
        self._ledger = {
            tuple(str(s) for s in plan): _PlanSteps(
                [float(x) for x in steps], float(bandwidth), int(window)
            )
            for plan, steps, bandwidth, window in state.get("ledger", [])
        }
        revert = state.get("revert")
        at = None if revert is None else unpack(revert[1])
        self._revert = None if revert is None or at is None else (tuple(revert[0]), at)
        self.reverts = int(state.get("reverts", 0))
        self._hold_length = int(state.get("hold_length", self.config.hold_windows))
        expired_link = state.get("expired_link")
        self._expired_link = None if expired_link is None else float(expired_link)
        probe = state.get("reference_probe")
        self._reference_probe = None if probe is None else (int(probe[0]), float(probe[1]))
        self._probe_wanted = False
        self._baseline_left = int(state.get("baseline_left", 0))
        self._seeking = bool(state.get("seeking", False))
        self.baseline_sought = bool(state.get("baseline_sought", False))
        self._measured = {
            tuple(str(spec) for spec in plan): None for plan in state.get("measured", [])
        }
        self._rechecked = {tuple(str(spec) for spec in plan) for plan in state.get("rechecked", [])}
        self.rechecks = int(state.get("rechecks", 0))
        stretch = state.get("stretch")
        self._stretch = (
            None
            if stretch is None
            else (tuple(str(spec) for spec in stretch[0]), [float(x) for x in stretch[1]])
        )


def _over(windows: int) -> str:
    return f" (median of {windows} windows)" if windows > 1 else ""
