"""Rank 0's side of a window boundary: from one window's measurements to the next plan.

The planner owns every piece of decision state: the link fit and its active probe, the cost
model, the smoothed per-layer error estimates, the convergence guards, the payoff check, the
dwell clock of each layer and the operator's overrides. It takes a
:class:`~autocomp.window.WindowMeasurement` (already combined over ranks) and returns the
plan, the layers whose error feedback must be reset, the size of the next link probe and the
window's record. It issues no collective and reads no clock, so a recorded sequence of
measurements replays exactly (``tests/test_stability.py``).

Steadiness, by design:

- measured relative errors are smoothed per (layer, compressor) with an EWMA
  (``error_smoothing``): one sampled step per window is a noisy estimate, and a plan that
  follows it flaps;
- a layer that changed compressor keeps it for ``dwell_windows`` windows (the engine's
  ``dwell`` rule), unless a guard backs it off, an operator pins it, the link moved by
  ``link_change`` since, or the switch was a guard's back-off and the guard has lifted:
  each switch resets warm starts and costs a few steps of accuracy;
- the engine's own hysteresis keeps an acceptable plan unless the new one is clearly better.

Warm-up: the first ``warmup_steps`` steps are uncompressed but for the options accurate
enough to send the gradient almost whole (the rules' ``warmup_max_error``: fp16, int8), unless
the first look at the link (a boundary a few steps in) shows communication making an
uncompressed step at least ``slow_link_ratio`` times the compute-only step (the compute, the
hooks' work and the exposed transfers; not the rest of a measured step, which no plan
removes): then every uncompressed step costs that many compressed ones, and the warm-up ends
there with the first decision. A glance after the very first step comes
earlier still, but acts only when communication dominates by ``dominance_ratio`` (the first
step's compute includes one-off costs, and its buckets are DDP's provisional ones): on a
10 Mbit/s link one uncompressed step of a 1.4M-parameter model takes 5 s, a tenth of a short
run. When the opening (``autocomp.opening``) ended the warm-up before step 0 on a guessed
compute, the first measured look checks that guess and resumes the warm-up when the measured
compute refutes it (``_opening_refuted``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autocomp.compressors import Collective, build_compressor
from autocomp.cost_model import CostModel
from autocomp.exposure import compute_seconds, overlap
from autocomp.guards import ConvergenceGuards
from autocomp.link_model import BandwidthMeter, LinkEstimate, latency_hops, link_bytes
from autocomp.link_probe import LinkProbe
from autocomp.nic_counters import NicCounters
from autocomp.opening import open_plan
from autocomp.policy.dwell import DwellClock
from autocomp.policy.engine import PolicyEngine
from autocomp.policy.idle_link import IdleLink
from autocomp.policy.payoff import PayoffCheck
from autocomp.policy.priors import rel_error
from autocomp.policy.rules import PolicyRules
from autocomp.policy.types import (
    NONE_SPEC,
    OPTIMIZER_RULES,
    LayerProfile,
    PolicyDecision,
    StepTiming,
)
from autocomp.runlog import RunLog
from autocomp.step_gap import StepGap
from autocomp.window import PlanUpdate, WindowMeasurement, WindowRecord

logger = logging.getLogger(__name__)

ERROR_READING = "averaged"
"""What the smoothed errors measure: the averaged update's error (``LayerWindow.avg_error``).
Saved with them, so that a checkpoint of each rank's own readings is not read as one."""

GLANCE_STEP = 1
"""The boundary after the first step: the warm-up ends there only if communication
dominates (``Config.dominance_ratio``)."""

__all__ = ["PlanUpdate", "WindowPlanner"]  # PlanUpdate: autocomp.window


def _compute(timings: dict[str, float]) -> float:
    """The window's compute-only step: measured per step (minimum), or from the medians."""
    measured = timings.get("compute_seconds")
    if measured:
        return measured
    return compute_seconds(
        timings["step_seconds"],
        timings["exposed_seconds"],
        timings["compress_seconds"],
        timings["backward_seconds"],
    )


def _optimizer_compressed(decision: PolicyDecision | None) -> bool:
    """Whether the optimizer (not a rule such as a pin) compressed any layer in ``decision``."""
    return decision is not None and any(
        layer.rule in OPTIMIZER_RULES and layer.spec != NONE_SPEC for layer in decision.layers
    )


def _predicted_gain(decision: PolicyDecision | None) -> float | None:
    """The share of the uncompressed step ``decision``'s plan was predicted to save."""
    if decision is None or decision.uncompressed_step_seconds is None:
        return None
    plain = decision.uncompressed_step_seconds
    if not (math.isfinite(plain) and plain > 0):
        return None
    return 1.0 - decision.predicted_step_seconds / plain


def _probe_rate(m: WindowMeasurement) -> float | None:
    """Link bytes per second of the probe taken at the end of window ``m``, if any."""
    if m.probe is None or m.probe[1] <= 0:
        return None
    payload_bytes, seconds = m.probe
    return link_bytes(Collective.ALL_REDUCE, payload_bytes, m.world_size) / seconds


def _uncompressed_step(m: WindowMeasurement, compute: float, half_sum: float = 0.0) -> float:
    """The window's step as its communication would make it uncompressed: what the warm-up's
    ratios are about.

    It is the compute-only step plus what communication measurably added: the hooks' work and
    the exposed transfers. The rest of a measured step is not the link's (start-up costs, the
    ranks' skew) and no plan removes it. On loopback the digits CNN's looks at steps 4 and 16
    measured steps 2.0-3.2x its compute with 1-5 ms exposed (1.6-1.9x with the work). Read as
    steps, they ended the warm-up there, on a link estimate of 0.25-0.4 GB/s from those first
    steps (1-4 GB/s later), and in one run a layer went to fp16 that made every step 30%
    slower for 1,200 steps. When the warm-up's accurate options ran
    (fp16, int8), the exposed time is scaled by the bytes they saved: read as measured, an
    fp16 plan on HSDP across two nodes at 200 Mbit/s showed 1.4x where uncompressed steps
    showed 1.7-2.0x, and the warm-up never ended early. Their own hook work is left out:
    an uncompressed step does not run it. Counted, fp16's 68 ms on the n-gram model's 8.4M-row
    table (a switch's first steps, on loopback) read an uncompressed step of 3.0x its 66 ms
    compute, where an all-reduce step (0.12-0.13 s) is 1.9x that reading, and the warm-up
    ended at step 4 with the table on fp16 until step 50. Nor is the CPU's sum of halves
    (``half_sum``: the plan's per step, which the link meter leaves out too) scaled up as if it
    were bytes: on that table fp16's exposed 38.6 ms held 13 ms of it, and scaled whole it
    read 2.05x where the rest reads 1.74x."""
    t = m.timings
    exposed = max(0.0, t["exposed_seconds"])
    sent, raw = m.bytes_per_step, m.uncompressed_bytes_per_step
    if 0 < sent < raw:
        exposed = max(exposed - half_sum, 0.5 * exposed) * raw / sent
    compressors = math.fsum(
        max(0.0, layer.hook_seconds or 0.0)
        for layer in m.layers.values()
        if layer.spec != NONE_SPEC
    )
    return compute + max(0.0, t["compress_seconds"] - compressors) + exposed


class WindowPlanner:
    """Decision state of one wrapped model (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Planner settings (all ranks hold the same; only rank 0 decides)."""

        target_overlap: float = 0.9
        """Fraction of communication to hide behind backward compute (the fast-link case)."""
        window: int = 20
        """Steps between decisions."""
        warmup_steps: int = 100
        """Uncompressed steps at the start (cut short on a slow link, see the module doc)."""
        slow_link_ratio: float = 2.0
        """An uncompressed step that communication makes at least this many times the
        compute-only step (communication takes at least as long as the compute, and each
        uncompressed step costs about two compressed ones) ends the warm-up at once."""
        dominance_ratio: float = 10.0
        """At the glance after the first step, the ratio of uncompressed to compute-only step
        that ends the warm-up (stricter than ``slow_link_ratio``: one step, with one-off
        costs)."""
        opening_ratio: float = 5.0
        """At the opening (before step 0: a link probe against 3x the first forward), the
        ratio of an uncompressed step's predicted communication to that compute estimate that
        decides before step 0 (see ``opening.open_plan``)."""
        start_cost_steps: float = 8.0
        """When the opening compresses, step 0 runs the warm-up's plan instead (its options
        within the rules' ``warmup_max_error``: int8, fp16) if that one step is predicted to
        cost at most this many of the opening plan's steps more than one of them; 0: never
        (see ``opening.warmup_start``). On the MLP LM (Adam) one int8 step 0 before PowerSGD
        rank 4 was worth 16-18 steps of progress at steps 100-400; on the GPT LM (AdamW)
        nothing measurable either way. Half the larger value is what the step is expected to
        be worth when half of all models gain from it."""
        error_smoothing: float = 0.3
        """EWMA weight of a new window's measured relative error."""
        dwell_windows: int = 5
        """Windows a layer keeps a compressor it switched to (guards and pins excepted; a switch
        that rested on a prior error is released once measured worse than that prior)."""
        settle_steps: int = 10
        """Steps after a switch before the layer's error and hook cost count: error feedback
        starts from an empty residual, so the first steps of a compressor understate its error
        (rank-1 PowerSGD on the GPT LM measured 0.16-0.74 one step in, 0.92-0.97 fifty steps
        in), and they overstate its cost (``_update_layers``)."""
        prior_miss: float = 0.1
        """A switch that rested on a prior error is released from its dwell once its measured
        relative error exceeds that prior by this much (and by the engine's switch margin):
        smaller misses, such as fp16 at 3.5e-4 against a 2.5e-4 prior, change nothing."""
        link_change: float = 2.0
        """A bandwidth ratio this large since a layer's switch lifts its dwell."""
        compute_change: float = 2.0
        """A ratio this large between the compute-only step a layer's switch was priced on
        and the one measured now lifts its dwell (an early look's one step can carry an
        evaluation or a slow first batch)."""
        probe: LinkProbe.Config | None = None
        """Active link probe settings (None: the defaults)."""

        def __post_init__(self) -> None:
            if not 0.0 < self.error_smoothing <= 1.0:
                raise ValueError(f"error_smoothing must be in (0, 1], got {self.error_smoothing}")
            if self.dwell_windows < 1:
                raise ValueError(f"dwell_windows must be >= 1, got {self.dwell_windows}")
            if not self.prior_miss >= 0:
                raise ValueError(f"prior_miss must be >= 0, got {self.prior_miss}")
            if self.settle_steps < 0:
                raise ValueError(f"settle_steps must be >= 0, got {self.settle_steps}")
            if not self.slow_link_ratio > 0:
                raise ValueError(f"slow_link_ratio must be > 0, got {self.slow_link_ratio}")
            if not self.dominance_ratio >= self.slow_link_ratio:
                raise ValueError(
                    f"dominance_ratio must be >= slow_link_ratio, got {self.dominance_ratio}"
                )
            if not (self.start_cost_steps >= 0 and math.isfinite(self.start_cost_steps)):
                raise ValueError(
                    f"start_cost_steps must be finite and >= 0, got {self.start_cost_steps}"
                )
            if not self.opening_ratio >= self.slow_link_ratio:
                raise ValueError(
                    f"opening_ratio must be >= slow_link_ratio, got {self.opening_ratio}"
                )
            if not self.link_change > 1.0:
                raise ValueError(f"link_change must be > 1, got {self.link_change}")
            if not self.compute_change > 1.0:
                raise ValueError(f"compute_change must be > 1, got {self.compute_change}")

    def __init__(
        self,
        rules: PolicyRules,
        names: Sequence[str],
        shapes: dict[str, Any],
        dtypes: dict[str, Any],
        pins: Sequence[tuple[str, str]],
        config: Config,
        *,
        world_size: int,
        device_type: str = "cpu",
        runlog: RunLog | None = None,
    ) -> None:
        self.rules = rules
        self.names = list(names)
        self.shapes = shapes
        self.dtypes = dtypes
        self.pins = list(pins)
        self.config = config
        self.runlog = runlog
        window = config.window
        # One sample per step: a window of a few steps must be enough for a first fit.
        self.meter = BandwidthMeter(BandwidthMeter.Config(min_samples=min(8, max(2, window))))
        self.probe = LinkProbe(config.probe or LinkProbe.Config())
        self.cost_model = CostModel(
            CostModel.Config(
                world_size=world_size,
                refit_every=64,
                auto_refit=False,  # one refit after each window's samples (_update_layers)
                device_type=device_type,
            )
        )
        self.engine = PolicyEngine(rules, self.cost_model, target_overlap=config.target_overlap)
        self.payoff = PayoffCheck(
            PayoffCheck.Config(
                min_gain=rules.min_gain,
                lossless_min_gain=rules.lossless_min_gain,
                revert_slack=rules.time_slack,
            )
        )
        self.idle_link = IdleLink(IdleLink.Config(link_change=config.link_change))
        guard_rules = rules.guards
        # The guards see one observation per window, so step counts become window counts.
        self.guards = ConvergenceGuards(
            ConvergenceGuards.Config(
                warmup_steps=config.warmup_steps,
                loss_divergence_ratio=guard_rules.loss_spike_ratio,
                loss_ewma_alpha=min(1.0, window / guard_rules.loss_window),
                loss_patience=max(2, math.ceil(guard_rules.loss_window / window)),
                critical_change=guard_rules.accordion_threshold,
                # Accordion compares intervals of ~accordion_interval_steps (a window of 5 steps
                # holds a couple of sampled steps, noise-dominated); an interval's median of
                # several windows is robust, so one interval over the threshold is enough.
                critical_block=max(1, math.ceil(guard_rules.accordion_interval_steps / window)),
                critical_patience=1 if guard_rules.accordion_interval_steps > window else 2,
                norm_smoothing=1.0,
                residual_factor=guard_rules.residual_factor,
                max_backoff=guard_rules.max_backoff_levels,
                recovery_windows=max(1, math.ceil(guard_rules.backoff_recovery_steps / window)),
            ),
            layers=self.names,
        )
        self.nic = NicCounters()
        self._nic_last = self.nic.sample()
        self.operator_pins: list[tuple[str, str]] = []
        """Pins posted by an operator (newest first); they win over the code's pins."""
        self.sparse_bytes: dict[str, int] = {}
        """Sparse gradients' bytes of rows and indices per step (the deciding rank's last
        step; set by the caller before :meth:`decide`), so the engine prices what they send,
        not their dense size."""
        self.row_shares: dict[str, float] = {}
        """Embedding tables' share of rows looked up by the first forward (``EmbeddingRows``):
        the opening's nonzero share, before the hook has measured one."""
        self.force_none = False
        """Operator override: every layer uncompressed from the next boundary."""
        self.frozen = False
        """Operator override: keep the current plan (measurements continue)."""
        self.opened = False
        """The opening decided the plan in use before step 0 (``opening.open_plan``)."""
        self._measured_since_opening = False
        self.warmup_done = config.warmup_steps == 0
        """Whether compression is allowed (warm-up over, or cut short on a slow link)."""
        self.rel_errors: dict[str, dict[str, float]] = {name: {} for name in self.names}
        """Smoothed measured relative error per layer and spec."""
        self.grad_norms: dict[str, float] = {}
        self.grad_l1s: dict[str, float] = {}
        """Last measured L1 norm of each layer's gradient (``error_weight = "grad_l1"``)."""
        self.nonzero_shares: dict[str, float] = {}
        """Smoothed nonzero share of each layer's gradient (top-k's prior reads it)."""
        self.last_decision: PolicyDecision | None = None
        self._locks_outvoted = False
        """The last decision found the dwell locks outvoted (``PolicyEngine.Config.
        dwell_max_loss``); the next such finding in a row releases them."""
        self._plan_before_baseline: dict[str, str] | None = None
        """The plan in use when the payoff check held the layers uncompressed to measure a
        baseline; the decision after the hold treats it as the plan in use (hysteresis)."""
        self._plan_ran: tuple[str, ...] | None = None
        self._windows = 0
        self._short_window = 0
        """Steps of the window this planner asked for at its last decision (0: regular)."""
        self.shared_schedule = False
        """Whether its loop keeps boundary-time collectives with peer loops (HSDP's replicate
        groups, a hierarchy's owners), which must all keep one boundary schedule. Then it
        never asks for a short window, and a refuted opening never resumes the warm-up
        (``_opening_refuted``; the warm-up flag sets the early looks): either would change
        this loop's schedule alone and leave the peers' collectives unmatched."""
        self.dwell = DwellClock(
            dwell_windows=config.dwell_windows,
            prior_miss=config.prior_miss,
            link_change=config.link_change,
            switch_margin=self.engine.config.switch_margin,
            compute_change=config.compute_change,
        )
        self._running_since: dict[str, tuple[str, int]] = {}
        """Layer -> (the spec its measurements ran, the first step they could have run it):
        keyed on what was measured, so a measurement taken before a switch took effect is
        never charged to the new compressor."""
        self.step_gap = StepGap()
        """The measured step beyond the model's prediction, added to every plan's."""

    # ---- the decision --------------------------------------------------------------------------

    def decide(
        self, m: WindowMeasurement, current: dict[str, str], *, peers_ended: bool = False
    ) -> PlanUpdate:
        """The plan after window ``m`` given the specs that ran (``current``).

        ``peers_ended``: another planner of the same synchronous step ended its warm-up at
        this boundary (HSDP: each replicate group has one; see ``AdaptiveLoop``), so this one
        ends it too: the step runs at the pace of the slowest group.
        """
        self._windows += 1
        world = m.world_size
        closed = self.meter.windows_closed
        estimate = self._update_link(m, current)
        refuted = self._opening_refuted(m, estimate)
        if refuted is not None:
            self.warmup_done = False
            self.guards.resume_warmup(m.step, refuted)
        warming = not self.warmup_done
        # The window that refutes the opening ran its plan: it cannot also end the warm-up.
        cut_short = refuted is None and self._first_look(m, peers_ended)
        # The decision that ends the warm-up opens the full candidate set: the warm-up's
        # switches (provisional) are decided again here, as at a full window, and without
        # hysteresis towards the warm-up's plan (chosen among a few options only).
        warmup_ended = warming and self.warmup_done
        settle = m.step >= self.config.window or warmup_ended
        probe_next = self.probe.next_window(
            blind=self.meter.blind,
            estimate=estimate,
            world_size=world,
            window_seconds=m.timings["step_seconds"] * m.window_steps,
            warming=not self.warmup_done,
            measured=self.meter.windows_closed > closed,
        )
        previous = self.last_decision
        compressed = _optimizer_compressed(previous)
        probe_rate = _probe_rate(m)
        if probe_rate is not None:
            self.probe.note_reading(probe_rate)
        window_index = m.step // max(1, self.config.window)
        # A compressed plan's own traffic can misread the link (autocomp.policy.idle_link):
        # the decision, and the dwell's "the link moved", go by the priced reading.
        priced = self.idle_link.priced(
            self._windows,
            estimate,
            compressed=compressed,
            reference=self.payoff.reference_probe_bytes > 0,
            probe_agrees=self.payoff.probe_agrees(probe_rate),
        )
        if self.idle_link.probe_wanted():
            probe_next = max(probe_next, self.payoff.reference_probe_bytes)
        if priced is not None:
            self.cost_model.update_link(priced)
        priced_bandwidth = None if priced is None else priced.bandwidth_bytes_per_s
        nic_now = self.nic.sample()
        nic_rate = self.nic.rate_since(self._nic_last) if self._nic_last is not None else None
        self._nic_last = nic_now
        grad_norms, residual_norms = self._update_layers(m)
        guard_events_before = len(self.guards.events)
        if m.nonfinite:
            # The hook already reset these layers on every rank at the step it happened; the
            # guard records and counts the events, and its reset queue is dropped here.
            self.guards.check_nonfinite(m.step, dict.fromkeys(m.nonfinite, True))
            self.guards.layers_to_reset()
        if cut_short:
            self.guards.end_warmup(m.step)
        if m.loss is not None:
            self.guards.observe_loss(m.step, m.loss)
        if grad_norms:
            # The looks before the first regular boundary hold a step or two each, and so
            # do the short windows of a baseline (``PayoffCheck.baseline_window_steps``).
            full = m.step >= self.config.window and not self._short_window
            self.guards.observe_window(m.step, grad_norms, residual_norms, full_window=full)
        resets = sorted(self.guards.layers_to_reset())
        new_events = [e.to_dict() for e in self.guards.events[guard_events_before:]]

        self._apply_overrides(m.step)
        self._observe_gap(m, previous, current)
        timing = self._timing(m)
        bandwidth = None if estimate is None else estimate.bandwidth_bytes_per_s
        hold = self._payoff(
            m,
            window_index,
            previous,
            compressed,
            probe_rate,
            current,
            bandwidth,
            warmup_plan=warming,
        )
        # The payoff check may need the idle link read to tell a link change from the plan's.
        probe_next = max(probe_next, self.payoff.probe_wanted())
        incumbent = self._incumbent(current)
        profiles = self._profiles(m)
        # After an opening decision the glance (one step, its compute inflated by one-off
        # costs: 0.75 s against 0.12 s later on the GPT LM) only measures: re-planning on it
        # put five layers on int8 for one step before the first look moved them back.
        glance_after_opening = self.opened and m.step <= GLANCE_STEP
        if (self.frozen or glance_after_opening) and previous is not None:
            decision = previous
            plan = [current[name] for name in self.names]
        else:
            # The opening's plan rests on priors and a guessed compute: the first measured
            # decision after it owes it no hysteresis (kept, top-1% on two of the GPT LM's
            # attention projections, prior error 0.95, ran 200 steps at 50 Mbit/s). Nor
            # does the warm-up's (gpt at 500 Mbit/s: fp16 kept at the look that ended the
            # warm-up, 0.16 s a step, until PowerSGD at step 50 made it 0.13 s).
            fresh = (self.opened and not self._measured_since_opening) or warmup_ended
            self._measured_since_opening = self.opened
            decision = self.engine.decide(
                profiles,
                timing,
                m.step,
                world,
                backoff=self.guards.backoff(),
                pins=[*self.operator_pins, *self.pins],
                force_none=self.force_none,
                current=None if fresh else incumbent,
                hold_reason=hold,
                locked={
                    **self._locked(
                        current, priced_bandwidth, settle=settle, compute=timing.compute_seconds
                    ),
                    **self._revert_locks(window_index, bandwidth),
                },
                warmup_done=self.warmup_done,
                release_locks=self._locks_outvoted,
                compression_measured=self.payoff.compression_measured(
                    tuple(current[name] for name in self.names)
                ),
            )
            self._locks_outvoted = decision.locks_outvoted
            specs = decision.plan
            plan = [specs[name] for name in self.names]
            self.last_decision = decision
        # A switch made at an early look, or inside the warm-up (limited to its most
        # accurate options), is decided again without a lock at the next full window or at
        # the decision that ends the warm-up (``settle`` above).
        # So is one made to measure an uncompressed baseline (``PayoffCheck``): that hold
        # decides its windows, and the decision after it starts afresh.
        provisional = (
            m.step < self.config.window or not self.warmup_done or self.payoff.seeking_baseline()
        )
        self.note_switches(
            plan,
            current,
            profiles,
            priced_bandwidth,
            provisional=provisional,
            compute=timing.compute_seconds,
        )
        self._confirm_if_moved(plan, current)
        timings = m.timings
        record = WindowRecord(
            step=m.step,
            bandwidth_bytes_per_s=bandwidth,
            latency_s=None if estimate is None else estimate.latency_s,
            nic_bytes_per_s=nic_rate,
            **timings,
            measured_overlap=overlap(
                timings["exposed_seconds"],
                timings["comm_busy_seconds"],
                timings["compress_seconds"],
            ),
            predicted_overlap=None if previous is None else previous.predicted_overlap,
            bytes_per_step=m.bytes_per_step,
            uncompressed_bytes_per_step=m.uncompressed_bytes_per_step,
            loss=m.loss,
            decision=decision.to_dict(),
            guard_events=new_events,
            predicted_step_seconds=None if previous is None else previous.predicted_step_seconds,
        )
        self._short_window = 0 if self.shared_schedule else self.payoff.baseline_window_steps()
        return PlanUpdate(
            plan=plan,
            resets=resets,
            probe_bytes=probe_next,
            probe_pass_seconds=(
                estimate.seconds(Collective.ALL_REDUCE, probe_next, world)
                if probe_next > 0 and estimate is not None
                else 0.0
            ),
            record=record,
            window_steps=self._short_window,
        )

    def open(
        self,
        probe: tuple[int, float],
        forward_seconds: float,
        world: int,
        current: dict[str, str],
        small_probe: tuple[int, float] | None = None,
    ) -> PlanUpdate | None:
        """The opening: a plan for step 0 from a link probe run before its first collective
        (:func:`autocomp.opening.open_plan`, with its small probe for the latency), or None."""
        self._windows += 1
        update = open_plan(self, probe, forward_seconds, world, current, small_probe)
        if update is not None:
            self._confirm_if_moved(update.plan, current)
        return update

    def _confirm_if_moved(self, plan: Sequence[str], current: dict[str, str]) -> None:
        """A plan that moves any layer is checked by a probe if its first window is blind
        (:meth:`~autocomp.link_probe.LinkProbe.plan_changed`)."""
        if any(spec != current[name] for name, spec in zip(self.names, plan, strict=True)):
            self.probe.plan_changed(self.cost_model.bandwidth_bytes_per_s)

    def note_switches(
        self,
        plan: Sequence[str],
        current: dict[str, str],
        profiles: Sequence[LayerProfile],
        bandwidth: float | None,
        provisional: bool = False,
        compute: float | None = None,
    ) -> None:
        """Start the dwell clock of every layer the plan moves (``provisional``: a plan from
        an early look, locked only until the first full window; ``compute``: the compute-only
        step it was priced on)."""
        profile_of = {p.name: p for p in profiles}
        backoff = self.guards.backoff()
        for name, spec in zip(self.names, plan, strict=True):
            if spec != current[name]:
                assumed = None
                if spec != NONE_SPEC and spec not in self.rel_errors[name]:
                    priors = self.engine.config.priors
                    assumed = rel_error(build_compressor(spec), profile_of[name], priors)
                self.dwell.note(
                    name,
                    self._windows,
                    bandwidth,
                    assumed,
                    backoff.get(name, 0),
                    provisional,
                    compute,
                )

    # ---- the pieces ----------------------------------------------------------------------------

    def half_sum_seconds(self, plan: dict[str, str]) -> float:
        """Per step, the time the plan's half-precision all-reduces spend summing (the cost
        model's measured per-element cost; zero where the opening measured none)."""
        total = 0.0
        for name, spec in plan.items():
            if spec == NONE_SPEC or name not in self.shapes:
                continue
            compressor = build_compressor(spec)
            if compressor.collective is not Collective.ALL_REDUCE:
                continue
            dtype = compressor.payload_dtype(self.dtypes[name])
            per_element = self.cost_model.half_sum_seconds_per_element(dtype)
            if per_element > 0.0:
                total += per_element * math.prod(self.shapes[name])
        return total

    def _update_link(self, m: WindowMeasurement, current: dict[str, str]) -> LinkEstimate | None:
        world = m.world_size
        # Rank 0's own steps (every rank sees the same ring), one busy period per step. A
        # half-precision all-reduce's busy time includes gloo summing halves on the CPU (slow
        # on CPU, about the transfer's own time on loopback): left in, an fp16 plan read the
        # loopback link at half its rate (mlp-lm, 459-576 against 854-1118 MB/s), which made
        # every uncompressed layer look slow and kept the plan compressed. The cost model
        # charges that sum separately (``LatencyCache.half_sum``), so the meter leaves it out.
        summing = self.half_sum_seconds(current)
        steps = m.collectives[-m.window_steps :]
        for step_collectives, seconds in zip(steps, m.busy_min, strict=False):
            self.meter.add_period(
                sum(latency_hops(kind, world) for kind, _, _ in step_collectives),
                sum(link_bytes(kind, nbytes, world) for kind, nbytes, _ in step_collectives),
                max(seconds - summing, 0.5 * seconds),
            )
        for step_collectives in m.collectives:
            for kind, nbytes, seconds in step_collectives:
                self.cost_model.add_comm_sample(kind, nbytes, world, seconds)
        if m.probe is not None:  # after the steps: the meter's window is in time order
            payload_bytes, seconds = m.probe
            self.meter.add_probe(
                latency_hops(Collective.ALL_REDUCE, world),
                link_bytes(Collective.ALL_REDUCE, payload_bytes, world),
                seconds,
            )
        # Before the warm-up ends, a step or two must do (the glance and the first looks).
        early = 1 if m.step <= GLANCE_STEP else 2
        return self.meter.end_window(min_samples=None if self.warmup_done else early)

    def _update_layers(self, m: WindowMeasurement) -> tuple[dict[str, float], dict[str, float]]:
        grad_norms: dict[str, float] = {}
        residual_norms: dict[str, float] = {}
        alpha = self.config.error_smoothing
        for name in self.names:
            layer = m.layers[name]
            if layer.nonzero is not None and math.isfinite(layer.nonzero):
                share = min(1.0, max(0.0, layer.nonzero))
                old_share = self.nonzero_shares.get(name)
                self.nonzero_shares[name] = (
                    share if old_share is None else old_share + alpha * (share - old_share)
                )
            running = self._running_since.get(name)
            if running is None or running[0] != layer.spec:
                # First window with this spec: it ran from this window's first step at most.
                running = (layer.spec, m.step - m.window_steps)
                self._running_since[name] = running
            settling = m.step - running[1] < self.config.settle_steps
            if layer.hook_seconds > 0 and layer.spec != NONE_SPEC and not settling:
                # A compressor's first steps on a layer cost more than the later ones (its
                # buffers are allocated, its kernels warmed): on the MLP LM at 200 Mbit/s
                # PowerSGD's hook work on fc1 took 19.6 and 14.0 ms in steps 0 and 1, then
                # 7.8-8.3 ms a step. The early looks' windows hold one or two such steps, and
                # each window is one sample of the median the cost model prices a measured
                # layer at, so they priced it for 200 steps. Top-k's cost depends on the
                # share it ran on (its selection).
                self.cost_model.add_sample(
                    build_compressor(layer.spec),
                    self.shapes[name],
                    layer.hook_seconds,
                    self.nonzero_shares.get(name, 1.0),
                )
            if layer.grad_norm is None:
                continue
            grad_norms[name] = layer.grad_norm
            residual_norms[name] = layer.residual_norm or 0.0
            if layer.grad_l1 is not None and math.isfinite(layer.grad_l1):
                self.grad_l1s[name] = layer.grad_l1
            # The averaged update's error is what the optimizer gets (autocomp.error_sketch);
            # a rank's own reading stands in only where no sketch came (a recording from
            # before them, or ranks that sampled different steps).
            reading = layer.avg_error if layer.avg_error is not None else layer.rel_error
            if layer.spec != NONE_SPEC and reading is not None and not settling:
                known = self.rel_errors[name]
                old = known.get(layer.spec)
                new = reading
                known[layer.spec] = new if old is None else old + alpha * (new - old)
        self.cost_model.refit_if_due()
        # Non-finite norms go to the guards (which react) but never into the policy's weights.
        self.grad_norms.update({n: v for n, v in grad_norms.items() if math.isfinite(v)})
        return grad_norms, residual_norms

    def ends_warmup(self, m: WindowMeasurement) -> bool:
        """Whether the warm-up is over after window ``m``: ended before, reaching its last
        step, or a step that communication dominates (no state changes; ``decide`` acts)."""
        if self.warmup_done or m.step >= self.config.warmup_steps:
            return True
        return self._dominance(m) is not None

    def _dominance(self, m: WindowMeasurement) -> float | None:
        """The uncompressed step's multiple of its compute when it is large enough to end
        the warm-up."""
        t = m.timings
        compute = _compute(t)
        glance = m.step <= GLANCE_STEP
        ratio = self.config.dominance_ratio if glance else self.config.slow_link_ratio
        ran = {name: layer.spec for name, layer in m.layers.items()}
        step = _uncompressed_step(m, compute, self.half_sum_seconds(ran))
        if m.profiled_ranks > 0 and compute > 0 and step >= ratio * compute:
            return step / compute
        return None

    def _opening_refuted(self, m: WindowMeasurement, estimate: LinkEstimate | None) -> str | None:
        """Why the opening's early end of the warm-up is taken back at this look, or None.

        The opening ends the warm-up on a guessed compute (``OPENING_COMPUTE_PER_FORWARD``
        times the first forward). The first measured look after it (the glance only measures)
        prices the uncompressed step on the measured compute and the same link: if that step
        is under ``slow_link_ratio`` times the compute, a look would not have ended the
        warm-up, and the opening's plan must not stand on the guess either. On loopback the
        n-gram model's first forward is 2.3 ms, a 7 ms guess against 89-98 ms measured (the
        table's dense gradient and AdamW over 8.5M parameters): a link of 0.7 GB/s read 6.9x,
        the opening put PowerSGD on the table, and it stayed 50 steps at 0.17-0.18 s a step
        against 0.13 uncompressed (thirty-seventh session's matrix). Every opening of that
        matrix on a shaped link measured 15-400x, far from this bar.
        """
        if not (
            not self.shared_schedule
            and self.opened
            and not self._measured_since_opening
            and self.warmup_done
            and self.config.warmup_steps > 0
            and GLANCE_STEP < m.step < self.config.warmup_steps
            and m.profiled_ranks > 0
            and estimate is not None
        ):
            return None
        compute = _compute(m.timings)
        raw = int(m.uncompressed_bytes_per_step)
        if not (compute > 0 and raw > 0):
            return None
        comm = estimate.seconds(Collective.ALL_REDUCE, raw, m.world_size)
        multiple = (compute + comm) / compute
        if multiple >= self.config.slow_link_ratio:
            return None
        # Logged once, by the guard event that ``decide`` records with it.
        return (
            f"the opening's guess of the compute is refuted: measured {compute:.3g} s, and an "
            f"uncompressed step ({comm:.3g} s of communication at {estimate.describe()}) "
            f"would take {multiple:.2f}x it, under slow_link_ratio {self.config.slow_link_ratio}"
        )

    def _first_look(self, m: WindowMeasurement, peers_ended: bool = False) -> bool:
        """True when this window ends the warm-up early (communication dominates here, or
        in a peer planner of the same step)."""
        if self.warmup_done:
            return False
        if m.step >= self.config.warmup_steps:
            self.warmup_done = True
            return False
        t = m.timings
        multiple = self._dominance(m)
        if multiple is None and not peers_ended:
            return False
        self.warmup_done = True
        if multiple is None:
            logger.info(
                "autocomp: warm-up ends at step %d, where another group ended it (this one "
                "read an uncompressed step of %.3g s, compute-only %.3g s)",
                m.step,
                t["step_seconds"],
                _compute(t),
            )
        else:
            logger.info(
                "autocomp: warm-up ends at step %d: an uncompressed step takes %.3g s, %.1fx "
                "the compute-only %.3g s (communication %.3g s; the step measured %.3g s)",
                m.step,
                multiple * _compute(t),
                multiple,
                _compute(t),
                t["comm_busy_seconds"],
                t["step_seconds"],
            )
        return True

    def _timing(self, m: WindowMeasurement) -> StepTiming:
        t = m.timings
        bucket_hideable: dict[int, float] = {}
        for layer in m.layers.values():
            if layer.bucket is not None and layer.bucket_hideable_seconds is not None:
                bucket_hideable[layer.bucket] = max(0.0, layer.bucket_hideable_seconds)
        compute = _compute(t)
        return StepTiming(
            backward_seconds=t["backward_seconds"],
            hideable_seconds=t["hideable_seconds"],
            step_seconds=t["step_seconds"],
            bucket_hideable_seconds=bucket_hideable if m.profiled_ranks > 0 else {},
            compute_seconds=compute if m.profiled_ranks > 0 else None,
            sync_seconds=self.step_gap.seconds,
        )

    def _observe_gap(
        self, m: WindowMeasurement, previous: PolicyDecision | None, current: dict[str, str]
    ) -> None:
        """Feed the step gap from a full window that ran the previous decision's plan
        throughout (the window before ran it too: a switch's first steps pay one-off costs,
        and the first window DDP's bucket rebuild), measured by the profiler."""
        if previous is None or m.profiled_ranks <= 0 or m.step < self.config.window:
            return
        ran = tuple(current[name] for name in self.names)
        if ran != self._plan_ran or previous.plan != dict(zip(self.names, ran, strict=True)):
            return
        added = previous.predicted_step_seconds - previous.compute_seconds - previous.sync_seconds
        self.step_gap.observe(m.timings["step_seconds"], _compute(m.timings), max(0.0, added))

    def _profiles(self, m: WindowMeasurement) -> list[LayerProfile]:
        return [
            LayerProfile(
                name=name,
                shape=self.shapes[name],
                dtype=self.dtypes[name],
                grad_norm=self.grad_norms.get(name, 0.0),
                grad_l1=self.grad_l1s.get(name),
                rel_error=dict(self.rel_errors[name]),
                nonzero_share=self.nonzero_shares.get(name, 1.0),
                bucket=m.layers[name].bucket,
                sparse_bytes=self.sparse_bytes.get(name),
            )
            for name in self.names
        ]

    @property
    def released(self) -> set[str]:
        """Layers whose dwell the last decision released: a switch made on a prior error
        measured worse than that prior (``Config.prior_miss``), or one made at an early look
        (the first full window decides it again)."""
        return self.dwell.released

    def _locked(
        self,
        current: dict[str, str],
        bandwidth: float | None,
        settle: bool = True,
        compute: float | None = None,
    ) -> dict[str, str]:
        """Layers still in their dwell period after a switch (:mod:`autocomp.policy.dwell`)."""
        return self.dwell.locked(
            self._windows,
            current,
            bandwidth,
            lambda name, spec: self.rel_errors[name].get(spec),
            self.guards.backoff(),
            settle=settle,
            compute=compute,
        )

    def _payoff(
        self,
        m: WindowMeasurement,
        window_index: int,
        previous: PolicyDecision | None,
        optimizer_compressed: bool,
        probe_rate: float | None,
        current: dict[str, str],
        bandwidth: float | None,
        *,
        warmup_plan: bool,
    ) -> str | None:
        # The window just measured ran the previous decision's plan; it counts for the payoff
        # check only if the window before ran the same plan (a switch's first steps pay
        # one-off costs, and the first window DDP's bucket rebuild).
        ran = tuple(current[name] for name in self.names)
        settled, self._plan_ran = ran == self._plan_ran, ran
        if probe_rate is not None and m.probe is not None:
            self.payoff.note_probe(m.probe[0], probe_rate, compressed=optimizer_compressed)
        # A window that ends before the first regular boundary is one of the early looks: its
        # steps still pay one-off costs (the digits ResNet at 200 Mbit/s: 22.1 ms a step
        # uncompressed over steps 4-8, 16-17 ms later), so as a baseline it made a plan that
        # saved nothing measure 25% faster. The payoff check neither keeps nor judges one.
        judged = settled and m.step >= self.config.window
        if optimizer_compressed and not settled:
            self.payoff.watch(bandwidth)
        if judged:
            self.payoff.observe(
                window_index,
                optimizer_compressed,
                m.timings["step_seconds"],
                bandwidth,
                ran,
                required_gain=0.0 if previous is None else previous.required_gain,
                probe_bytes_per_s=probe_rate,
                # Measuring a missing baseline is for the plans chosen after the warm-up: the
                # warm-up's own plan (``warmup_plan``: this window ran it, and the decision
                # that ends the warm-up replaces it) saves little by design. Judged at the
                # warm-up's last boundary, its fp16 plan sought a baseline there that held
                # the LSTM LM at 500 Mbit/s uncompressed for steps 100-118 (0.13 s a step
                # against 0.09 s for the rank-16 plan that followed).
                predicted_gain=(
                    _predicted_gain(previous) if self.warmup_done and not warmup_plan else None
                ),
            )
        return self.payoff.hold_reason(window_index, bandwidth)

    def _incumbent(self, current: dict[str, str]) -> dict[str, str]:
        """The plan the engine's hysteresis holds to: the one in use, except at the decision
        that ends a baseline hold, where it is the plan the hold interrupted.

        The hold measures the link uncompressed; it is not a decision against that plan.
        Searched afresh after it, with nothing in use to keep, the engine took whatever plan
        the slack ranked first from that window's predictions, and its dwell locks then held
        it: on the LSTM LM at 500 Mbit/s (60 s, seeds 1-3, fiftieth session) the plans
        before the hold measured 0.086-0.093 s a step, as the static rank-16 plan's 0.088;
        two of the three after it measured 0.102-0.113 for the next 100-250 steps.
        """
        seeking = self.payoff.seeking_baseline()
        if seeking:
            if self._plan_before_baseline is None:
                self._plan_before_baseline = dict(current)
            return current
        before, self._plan_before_baseline = self._plan_before_baseline, None
        if before is None:
            return current
        return {name: before.get(name, spec) for name, spec in current.items()}

    def _revert_locks(self, window_index: int, bandwidth: float | None) -> dict[str, str]:
        """The faster measured plan the payoff check sends the engine back to, as locks."""
        plan = self.payoff.revert_plan(window_index, bandwidth)
        return {} if plan is None else dict(zip(self.names, plan, strict=True))

    def _apply_overrides(self, step: int) -> None:
        """Operator requests from the run log, applied by rank 0 at this boundary."""
        if self.runlog is None:
            return
        for override in self.runlog.pending_overrides():
            status = "applied"
            kind = override.kind
            if kind == "pin":
                try:
                    spec = build_compressor(override.spec or "").spec
                except (TypeError, ValueError) as err:
                    status = f"rejected: {err}"
                else:
                    self.operator_pins = [p for p in self.operator_pins if p[0] != override.glob]
                    self.operator_pins.insert(0, (str(override.glob), spec))
            elif kind == "unpin":
                self.operator_pins = [p for p in self.operator_pins if p[0] != override.glob]
            elif kind in ("force_none", "unforce"):
                self.force_none = kind == "force_none"
            elif kind in ("freeze", "unfreeze"):
                self.frozen = kind == "freeze"
            else:
                status = f"rejected: unknown kind {kind!r}"
            logger.info(
                "autocomp: operator override #%d %s %s %s by %s at step %d: %s",
                override.id,
                kind,
                override.glob or "",
                override.spec or "",
                override.who,
                step,
                status,
            )
            self.runlog.mark_overrides_applied([override.id], step, status=status)

    # ---- checkpointing -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "meter": self.meter.state_dict(),
            "probe": self.probe.state_dict(),
            "cost_model": self.cost_model.state_dict(),
            "guards": self.guards.state_dict(),
            "payoff": self.payoff.state_dict(),
            "idle_link": self.idle_link.state_dict(),
            "rel_errors": {k: dict(v) for k, v in self.rel_errors.items()},
            "error_reading": ERROR_READING,
            "grad_norms": dict(self.grad_norms),
            "grad_l1s": dict(self.grad_l1s),
            "nonzero_shares": dict(self.nonzero_shares),
            "force_none": self.force_none,
            "frozen": self.frozen,
            "operator_pins": [list(pin) for pin in self.operator_pins],
            "warmup_done": self.warmup_done,
            "opened": self.opened,
            "measured_since_opening": self._measured_since_opening,
            "windows": self._windows,
            "short_window": self._short_window,
            "changed_at": self.dwell.state_dict(),
            "locks_outvoted": self._locks_outvoted,
            "plan_before_baseline": self._plan_before_baseline,
            "running_since": {k: list(v) for k, v in self._running_since.items()},
            "step_gap": self.step_gap.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.meter.load_state_dict(state["meter"])
        self.probe.load_state_dict(state.get("probe", {}))
        self.cost_model.load_state_dict(state["cost_model"])
        self.cost_model.update_link(self.meter.estimate)
        self.guards.load_state_dict(state["guards"])
        self.payoff.load_state_dict(state.get("payoff", {}))
        self.idle_link.load_state_dict(state.get("idle_link", {}))
        # Errors saved before the averaged reading are each rank's own, up to 4x larger: the
        # next windows measure them again rather than price against them.
        saved = state["rel_errors"] if state.get("error_reading") == ERROR_READING else {}
        self.rel_errors = {name: dict(saved.get(name, {})) for name in self.names}
        self.grad_norms = dict(state["grad_norms"])
        self.grad_l1s = {str(k): float(v) for k, v in state.get("grad_l1s", {}).items()}
        self.nonzero_shares = {str(k): float(v) for k, v in state.get("nonzero_shares", {}).items()}
        self.force_none = bool(state["force_none"])
        self.frozen = bool(state["frozen"])
        self.operator_pins = [(str(g), str(spec)) for g, spec in state.get("operator_pins", [])]
        self.warmup_done = bool(state.get("warmup_done", self.warmup_done))
        # A restore between the opening's decision and the first measured one must still
        # let that one start from measurements (no hysteresis toward the opening's priors).
        self.opened = bool(state.get("opened", False))
        self._measured_since_opening = bool(state.get("measured_since_opening", False))
        self._windows = int(state.get("windows", 0))
        self._short_window = int(state.get("short_window", 0))
        self.dwell.load_state_dict(state.get("changed_at", {}))
        self._locks_outvoted = bool(state.get("locks_outvoted", False))
        before = state.get("plan_before_baseline")
        self._plan_before_baseline = (
            None if before is None else {str(k): str(v) for k, v in before.items()}
        )
        self._running_since = {
            str(k): (str(v[0]), int(v[1])) for k, v in state.get("running_since", {}).items()
        }
        self.step_gap.load_state_dict(state.get("step_gap", {}))
