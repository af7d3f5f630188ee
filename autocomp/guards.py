"""Convergence guards: when the adaptive controller must stop trusting compression.

Compression that is fine for a network link can still hurt training. These guards watch a few
cheap signals and tell the controller to compress less (a *back-off level*, per layer) or to
drop a layer's error-feedback residual, and to relax again once things stay quiet:

* ``warmup``: the first ``warmup_steps`` steps train uncompressed (one event when they end).
* ``nonfinite``: NaN/Inf in a layer's gradient -> that step uncompressed + EF reset of the
  layer; a non-finite residual norm -> EF reset; a non-finite loss -> ignored.
* ``loss_divergence``: the loss EWMA stays above ``loss_divergence_ratio`` x the warm-up
  baseline and rises, for ``loss_patience`` observations -> every layer backs off one level.
* ``critical_regime`` (Accordion, Agarwal et al. 2021): the median gradient norm of an
  interval of ``critical_block`` windows differs by more than ``critical_change`` (relative)
  from the reference built from the calm intervals before, in ``critical_patience`` intervals
  in a row -> that layer backs off one level until an interval is calm again (Accordion's two
  levels, re-chosen every interval: the level does not stack while the regime lasts, and needs
  no quiet windows to lift). One noisy window neither fires nor moves it, and the level goes
  on or off at most once per ``critical_hold_windows`` full windows (a switch costs a warm
  start).
* ``loss_scale``: every layer's gradient norm moved by the same power of two at once, which is
  what AMP's GradScaler does to gradients when it changes its scale -> the references are
  rescaled by that factor (no back-off): the guards' statistics do not move with the scale.
  A fall is taken for one only in the window of a non-finite step or the next (the scaler
  backs off at an overflow and nowhere else).
* ``residual_growth``: a layer's residual norm exceeds ``residual_factor`` x its gradient norm
  -> EF reset + that layer backs off one level.
* ``recovered``: ``recovery_windows`` quiet windows in a row -> one back-off level removed
  (loss and residual back-off); a calm interval -> the critical regime's level removed.

Back-off is in levels, not compressors: level *k* means "k rungs less aggressive than the
bandwidth-optimal choice" on whatever ladder the controller uses for that layer (e.g.
``powersgd:rank=4`` -> ``rank=8`` -> ``rank=16`` -> ``none``). Back off fast (one window),
recover slowly (several quiet windows), like AIMD congestion control: a wrong back-off costs
bandwidth for a while, a wrong "keep compressing" can cost the run.

Pure logic: no collectives, no clocks, no randomness. **Every rank must feed the guards the
same numbers in the same order** (the controller combines ranks' observations first, e.g. an
all-reduce of squared norms and of the loss), because the decisions change what each rank
sends; diverging decisions would mismatch the collectives and hang. The guard names, actions
and events are in :mod:`autocomp.guard_events`, the loss-divergence test in
:mod:`autocomp.guard_loss`, the critical-regime and loss-scale tests on gradient norms in
:mod:`autocomp.guard_regimes`; the tensor helpers that turn gradients and
residuals into the numbers fed here are in :mod:`autocomp.guard_inputs`.

Integration contract (what the controller/hook wire up):

* ``step_uncompressed(step)``: when True, every layer of that step goes through a plain
  averaging all-reduce and no residual is added (warm-up, and steps reported non-finite).
* ``check_nonfinite(step, flags)`` with rank-combined flags (logical OR over ranks, e.g. a MAX
  all-reduce of :func:`~autocomp.guard_inputs.nonfinite_mask`), ideally before launching that
  step's compressed collectives; if the flags are only known afterwards, pass ``step + 1`` so the
  *next* step goes uncompressed. The returned layers (also queued in ``layers_to_reset()``) must
  have their residual dropped and their compressor state re-initialised (a NaN in PowerSGD's
  warm-start factor would otherwise persist forever). Resetting twice is harmless.
* ``observe_loss(step, loss)`` with the rank-averaged loss, every step or every few steps.
* ``observe_window(step, grad_norms, residual_norms)`` once per controller window (empty
  mappings are fine: the call also closes the window for recovery counting). Both norms must
  be in the same units: the hook compresses ``grad / world_size``, so measure that (before
  the residual is added) and the residual; combine over ranks as ``sqrt(mean(norm**2))``. The
  window's gradient norm should average several steps (e.g. root-mean-square of the per-step
  norms): single-step norms are too noisy for a 0.5 relative-change test.
* Every step boundary: apply ``backoff()`` to the compressed layers' ladders (uncompressed
  layers stay uncompressed) and reset the residuals named by ``layers_to_reset()``.
* Checkpoint ``state_dict()`` with the controller's state and restore with
  ``load_state_dict()`` so a resumed run makes the same decisions.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from autocomp.guard_events import (
    ACTION_AT_MAX,
    ACTION_BACK_OFF,
    ACTION_BACK_OFF_ALL,
    ACTION_CRITICAL_HOLDS,
    ACTION_ENABLE,
    ACTION_IGNORED,
    ACTION_RECOVER,
    ACTION_RESCALED,
    ACTION_RESET,
    ACTION_RESET_AT_MAX,
    ACTION_RESET_BACK_OFF,
    ACTION_RESET_ONLY,
    ACTION_RESUME_WARMUP,
    ACTION_UNCOMPRESSED_RESET,
    CRITICAL_REGIME,
    GUARD_NAMES,
    LOSS_DIVERGENCE,
    LOSS_SCALE,
    NONFINITE,
    RECOVERED,
    RESIDUAL_GROWTH,
    WARMUP,
    GuardEvent,
)
from autocomp.guard_loss import LossDivergence
from autocomp.guard_regimes import NormRegimes

logger = logging.getLogger(__name__)

__all__ = ["ConvergenceGuards"]

STATE_DICT_VERSION = 1


class ConvergenceGuards:
    """Turns loss, gradient-norm and residual-norm observations into back-off decisions.

    See the module docstring for the guards and the integration contract. Methods taking a
    ``step`` expect steps in non-decreasing order.
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Thresholds of the guards (defaults and their reasons in the field docs)."""

        warmup_steps: int = 1000
        """Steps trained uncompressed first; torch's PowerSGD hook uses the same default."""
        loss_ewma_alpha: float = 0.05
        """EWMA weight of a new loss; 0.05 averages ~40 steps, enough to smooth minibatch noise."""
        loss_divergence_ratio: float = 1.5
        """Loss EWMA above this multiple of the warm-up baseline counts as diverging."""
        loss_patience: int = 20
        """Consecutive diverging, rising observations before the global back-off."""
        critical_change: float = 0.5
        """Relative gradient-norm change against the reference marking a critical regime
        (Accordion)."""
        critical_patience: int = 2
        """Windows in a row the change must persist (in the same direction) before it counts:
        one window's norms come from a couple of sampled steps and can be noise."""
        norm_smoothing: float = 0.5
        """EWMA weight of a calm window's norm in the reference."""
        critical_block: int = 1
        """Windows per Accordion interval: the test compares the median norm of one interval
        with the reference built from the intervals before, once per interval. Accordion
        compares gradient norms over long intervals (epochs); the adaptive loop makes an
        interval about 100 steps, since a short window holds a couple of sampled steps whose
        norms are mostly noise, and a median ignores one window's spike."""
        loss_scale_tolerance: float = 0.1
        """A common change of all layers' norms within this of a power of two (in log2 units)
        is taken for a loss-scale change (GradScaler), not a critical regime."""
        residual_factor: float = 32.0
        """Residual/gradient norm ratio deemed runaway; healthy EF sits near 1x-10x (top-k 1%)."""
        max_backoff: int = 3
        """Highest back-off level of a layer (the controller's ladder should reach 'none')."""
        recovery_windows: int = 5
        """Quiet windows in a row before one back-off level is removed."""
        critical_hold_windows: int = 5
        """Full windows a layer's critical-regime level stays on, or off, before it may
        change again: each change switches the layer's compressor and costs its warm start."""
        max_events: int = 1000
        """Events kept in memory (and checkpoints); older ones are dropped and counted."""

        def __post_init__(self) -> None:
            checks = [
                ("warmup_steps", self.warmup_steps >= 0, ">= 0"),
                ("loss_ewma_alpha", 0.0 < self.loss_ewma_alpha <= 1.0, "in (0, 1]"),
                ("loss_divergence_ratio", self.loss_divergence_ratio > 1.0, "> 1"),
                ("loss_patience", self.loss_patience >= 1, ">= 1"),
                ("critical_change", self.critical_change > 0.0, "> 0"),
                ("critical_patience", self.critical_patience >= 1, ">= 1"),
                ("norm_smoothing", 0.0 < self.norm_smoothing <= 1.0, "in (0, 1]"),
                ("critical_block", self.critical_block >= 1, ">= 1"),
                ("loss_scale_tolerance", 0.0 <= self.loss_scale_tolerance < 0.5, "in [0, 0.5)"),
                ("residual_factor", self.residual_factor > 0.0, "> 0"),
                ("max_backoff", self.max_backoff >= 0, ">= 0"),
                ("recovery_windows", self.recovery_windows >= 1, ">= 1"),
                ("critical_hold_windows", self.critical_hold_windows >= 1, ">= 1"),
                ("max_events", self.max_events >= 1, ">= 1"),
            ]
            for name, ok, valid in checks:
                if not ok:
                    value = getattr(self, name)
                    raise ValueError(f"ConvergenceGuards.Config.{name}={value!r}: must be {valid}")

    def __init__(self, config: Config | None = None, *, layers: Iterable[str] = ()) -> None:
        """``layers``: every layer the controller may back off (others are added when seen)."""
        self.config = config if config is not None else ConvergenceGuards.Config()
        self._layers: dict[str, None] = dict.fromkeys(layers)
        self._warmup_announced = False
        self._loss = LossDivergence(
            self.config.loss_ewma_alpha,
            self.config.loss_divergence_ratio,
            self.config.loss_patience,
        )
        self._global_level = 0
        self._global_quiet = 0
        self._layer_level: dict[str, int] = {}
        self._layer_quiet: dict[str, int] = {}
        self._critical: set[str] = set()
        self._full_windows = 0
        """Full windows closed so far (the early looks excluded): the critical level's clock."""
        self._critical_changed: dict[str, int] = {}
        """``_full_windows`` when each layer's critical level last went on or off."""
        # Windows left in which a fall of every norm may be a loss-scale back-off (set by a
        # non-finite step: GradScaler lowers its scale there and nowhere else).
        self._overflow_windows = 0
        self._norms = NormRegimes(
            change=self.config.critical_change,
            patience=self.config.critical_patience,
            smoothing=self.config.norm_smoothing,
            block=self.config.critical_block,
            scale_tolerance=self.config.loss_scale_tolerance,
        )
        self._warmup_end = self.config.warmup_steps
        self._pending_resets: set[str] = set()
        self._uncompressed_steps: set[int] = set()
        self._events: deque[GuardEvent] = deque(maxlen=self.config.max_events)
        self._events_dropped = 0
        self._counts: dict[str, int] = dict.fromkeys(GUARD_NAMES, 0)

    # ---- warm-up and uncompressed steps ------------------------------------------------------

    def in_warmup(self, step: int) -> bool:
        """True while ``step`` must train uncompressed (the loss baseline is built meanwhile).

        The first call of any method at or after the end of warm-up records the ``warmup`` event.
        """
        self._note_step(step)
        return step < self._warmup_end

    def end_warmup(self, step: int) -> None:
        """End the warm-up at ``step`` (earlier than configured): the link is so slow that
        every uncompressed step costs many compressed ones (the planner decides that)."""
        self._warmup_end = min(self._warmup_end, step)
        self._note_step(step)

    def resume_warmup(self, step: int, detail: str) -> None:
        """Take back an early end of the warm-up at ``step``: what ended it was refuted by a
        measurement (the planner's opening check), so the loss baseline goes on building and
        the configured end stands again."""
        if self._warmup_end >= self.config.warmup_steps:
            return
        self._warmup_end = self.config.warmup_steps
        self._warmup_announced = False
        self._loss.unfreeze()
        self._record(step, WARMUP, None, detail, ACTION_RESUME_WARMUP)

    def step_uncompressed(self, step: int) -> bool:
        """True when every layer of ``step`` must use a plain all-reduce, no residual added.

        That is during warm-up and for steps :meth:`check_nonfinite` reported, so NaN/Inf never
        enters a residual or a compressor's warm-start state.
        """
        self._uncompressed_steps = {s for s in self._uncompressed_steps if s >= step}
        return self.in_warmup(step) or step in self._uncompressed_steps

    # ---- per-step checks ---------------------------------------------------------------------

    def check_nonfinite(self, step: int, layer_flags: Mapping[str, bool]) -> list[str]:
        """Record layers whose gradient held NaN/Inf at ``step``; return them, sorted.

        ``layer_flags`` must be combined over ranks (True if any rank saw a non-finite value).
        A non-empty result marks ``step`` uncompressed (:meth:`step_uncompressed`) and queues
        the layers in :meth:`layers_to_reset`. No back-off: non-finite gradients come from the
        loss scaler (fp16 AMP overflows routinely), the data or the model, not from compression.
        """
        self._note_step(step)
        bad = sorted(name for name, flag in layer_flags.items() if flag)
        for name in bad:
            self._register(name)
            self._pending_resets.add(name)
            self._record(step, NONFINITE, name, "NaN/Inf in gradient", ACTION_UNCOMPRESSED_RESET)
        if bad:
            self._uncompressed_steps.add(step)
            # Its window and the next: the scale falls at the overflow, and the next window's
            # sampled steps may be the first to run at the lower scale.
            self._overflow_windows = 2
        return bad

    def observe_loss(self, step: int, loss: float) -> None:
        """Feed the rank-averaged training loss of ``step``.

        When the loss diverges (the rule is in :mod:`autocomp.guard_loss`), every layer backs
        off one level. Non-finite losses are recorded and otherwise ignored.
        """
        self._note_step(step)
        value = float(loss)
        if not math.isfinite(value):
            detail = f"loss is {value}; not fed to the EWMA"
            self._record(step, NONFINITE, None, detail, ACTION_IGNORED)
            return
        detail = self._loss.observe(step, value, compressing=step >= self._warmup_end)
        if detail is None:
            return
        if self._global_level < self.config.max_backoff:
            self._global_level += 1
            action = ACTION_BACK_OFF_ALL
        else:
            action = ACTION_AT_MAX
        self._global_quiet = 0
        detail += f"; global level now {self._global_level}"
        self._record(step, LOSS_DIVERGENCE, None, detail, action)

    # ---- per-window checks -------------------------------------------------------------------

    def observe_window(
        self,
        step: int,
        grad_norms: Mapping[str, float],
        residual_norms: Mapping[str, float],
        *,
        full_window: bool = True,
    ) -> None:
        """Close a controller window ending at ``step`` with rank-combined per-layer norms.

        ``full_window`` False: the window is one of the adaptive loop's early looks (a step
        or two): its gradient norms are single samples, so they do not enter the
        critical-regime test (its intervals would otherwise pair a look at step 1 or 2 with
        a full window, and the fall of every norm in the first steps of training read as a
        critical regime on every layer); the residual test still runs.

        Per layer (in name order): a relative gradient-norm change above ``critical_change``
        against the previous window is a critical regime (back off one level); a residual norm
        above ``residual_factor`` x the gradient norm is runaway error feedback (reset that
        residual and back off one level). A layer backs off at most one level per window. A
        layer with a finite gradient norm and no trouble this window counts a quiet window;
        layers absent from ``grad_norms`` neither recover nor lose their quiet count. Nothing
        backs off during warm-up, but norms are recorded so the first compressed window has
        a reference.
        """
        self._note_step(step)
        cfg = self.config
        compressing = step >= self._warmup_end
        if full_window:
            self._full_windows += 1
        self._check_loss_scale(step, grad_norms)
        for name in sorted(set(grad_norms) | set(residual_norms)):
            self._register(name)
            grad = float(grad_norms[name]) if name in grad_norms else math.nan
            residual = float(residual_norms[name]) if name in residual_norms else None
            if not math.isfinite(grad) and name in grad_norms:
                logger.debug("autocomp guards step %d: %s grad norm %s skipped", step, name, grad)
            backed_off, moving = (
                self._check_critical(step, name, grad, compressing)
                if full_window
                else (False, False)
            )
            troubled = self._check_residual(step, name, grad, residual, compressing, backed_off)
            if moving or troubled:
                self._layer_quiet[name] = 0
            elif math.isfinite(grad):
                self._count_quiet_layer(step, name)

        if self._loss.troubled:
            self._global_quiet = 0
        elif self._global_level > 0:
            self._global_quiet += 1
            if self._global_quiet >= cfg.recovery_windows:
                self._global_level -= 1
                self._record(
                    step,
                    RECOVERED,
                    None,
                    f"{self._global_quiet} quiet loss windows; global level now "
                    f"{self._global_level}",
                    ACTION_RECOVER,
                )
                self._global_quiet = 0
        self._loss.troubled = False

    # ---- decisions for the controller --------------------------------------------------------

    def backoff(self) -> dict[str, int]:
        """Back-off level of every known layer: global (loss) + its own (residual) + 1 in a
        critical regime, at most ``max_backoff``."""
        cap = self.config.max_backoff
        return {name: self._effective_level(name, cap) for name in self._layers}

    def layers_to_reset(self) -> set[str]:
        """Layers whose residual (and compressor state) must be reset; drained by this call."""
        pending, self._pending_resets = self._pending_resets, set()
        return pending

    @property
    def events(self) -> list[GuardEvent]:
        """The most recent events, oldest first (at most ``max_events``)."""
        return list(self._events)

    @property
    def events_dropped(self) -> int:
        """Events no longer in :attr:`events` because the buffer was full."""
        return self._events_dropped

    def counts(self) -> dict[str, int]:
        """Events per guard since the start of training, dropped ones included."""
        return dict(self._counts)

    # ---- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; identical on all ranks, so saving one copy is enough."""
        return {
            "version": STATE_DICT_VERSION,
            "config": asdict(self.config),
            "layers": list(self._layers),
            "warmup_announced": self._warmup_announced,
            "loss_ewma": self._loss.ewma,
            "loss_baseline": self._loss.baseline,
            "loss_streak": self._loss.streak,
            "loss_reference": self._loss.reference,
            "loss_escalation_bar": self._loss.escalation_bar,
            "loss_troubled": self._loss.troubled,
            "global_level": self._global_level,
            "global_quiet": self._global_quiet,
            "layer_level": dict(self._layer_level),
            "layer_quiet": dict(self._layer_quiet),
            "critical_layers": sorted(self._critical),
            "full_windows": self._full_windows,
            "critical_changed": dict(self._critical_changed),
            "overflow_windows": self._overflow_windows,
            "common_norm_ratio": self._norms.common_ratio,
            "prev_grad_norm": dict(self._norms.reference),
            "critical_streak": dict(self._norms.streak),
            "block_norms": {k: list(v) for k, v in self._norms.block_norms.items()},
            "warmup_end": self._warmup_end,
            "pending_resets": sorted(self._pending_resets),
            "uncompressed_steps": sorted(self._uncompressed_steps),
            "events": [event.to_dict() for event in self._events],
            "events_dropped": self._events_dropped,
            "counts": dict(self._counts),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output; decisions then continue exactly as before."""
        version = state.get("version")
        if version != STATE_DICT_VERSION:
            raise ValueError(
                f"guards state_dict version {version!r} is not supported "
                f"(expected {STATE_DICT_VERSION})"
            )
        saved_config = state.get("config")
        if saved_config is not None and dict(saved_config) != asdict(self.config):
            logger.warning(
                "autocomp guards: restoring state saved with a different Config; decisions "
                "after the resume may differ from an uninterrupted run"
            )

        def optional_float(value: Any) -> float | None:
            return None if value is None else float(value)

        self._layers = dict.fromkeys(str(name) for name in state["layers"])
        self._warmup_announced = bool(state["warmup_announced"])
        self._loss.ewma = optional_float(state["loss_ewma"])
        self._loss.baseline = optional_float(state["loss_baseline"])
        self._loss.streak = int(state["loss_streak"])
        self._loss.reference = optional_float(state["loss_reference"])
        self._loss.escalation_bar = optional_float(state["loss_escalation_bar"])
        self._loss.troubled = bool(state["loss_troubled"])
        self._global_level = int(state["global_level"])
        self._global_quiet = int(state["global_quiet"])
        self._layer_level = {str(k): int(v) for k, v in state["layer_level"].items()}
        self._layer_quiet = {str(k): int(v) for k, v in state["layer_quiet"].items()}
        self._critical = {str(name) for name in state.get("critical_layers", [])}
        self._full_windows = int(state.get("full_windows", 0))
        self._critical_changed = {
            str(k): int(v) for k, v in state.get("critical_changed", {}).items()
        }
        self._overflow_windows = int(state.get("overflow_windows", 0))
        self._norms.common_ratio = optional_float(state.get("common_norm_ratio"))
        self._norms.reference = {str(k): float(v) for k, v in state["prev_grad_norm"].items()}
        self._norms.streak = {str(k): int(v) for k, v in state.get("critical_streak", {}).items()}
        self._norms.block_norms = {
            str(k): [float(x) for x in v] for k, v in state.get("block_norms", {}).items()
        }
        self._warmup_end = int(state.get("warmup_end", self.config.warmup_steps))
        self._pending_resets = {str(name) for name in state["pending_resets"]}
        self._uncompressed_steps = {int(s) for s in state["uncompressed_steps"]}
        events = [GuardEvent.from_dict(e) for e in state["events"]]
        self._events = deque(events, maxlen=self.config.max_events)
        self._events_dropped = int(state["events_dropped"]) + len(events) - len(self._events)
        self._counts = dict.fromkeys(GUARD_NAMES, 0)
        self._counts.update({str(k): int(v) for k, v in state["counts"].items()})

    # ---- internals ---------------------------------------------------------------------------

    def _register(self, name: str) -> None:
        if name not in self._layers:
            self._layers[name] = None

    def _effective_level(self, name: str, cap: int) -> int:
        critical = 1 if name in self._critical else 0
        return min(cap, self._global_level + self._layer_level.get(name, 0) + critical)

    def _note_step(self, step: int) -> None:
        if not self._warmup_announced and step >= self._warmup_end:
            self._warmup_announced = True
            detail = f"compression allowed from step {self._warmup_end}"
            if self._warmup_end < self.config.warmup_steps:
                detail += f" (warm-up of {self.config.warmup_steps} cut short: slow link)"
            self._record(step, WARMUP, None, detail, ACTION_ENABLE)

    def _back_off_layer(self, step: int, name: str, detail: str) -> None:
        """Runaway error feedback: reset the residual and raise the layer's own level."""
        cap = self.config.max_backoff
        before = self._effective_level(name, cap)
        own = self._layer_level.get(name, 0)
        if own < cap:
            # Raised even when the effective level is capped: it still counts once the global
            # (loss) back-off recovers.
            self._layer_level[name] = own + 1
        after = self._effective_level(name, cap)
        self._layer_quiet[name] = 0
        self._pending_resets.add(name)
        action = ACTION_RESET_BACK_OFF if after > before else ACTION_RESET_AT_MAX
        self._record(step, RESIDUAL_GROWTH, name, f"{detail}; level now {after}", action)

    def _check_critical(
        self, step: int, name: str, grad: float, compressing: bool
    ) -> tuple[bool, bool]:
        """Accordion test of an interval against the reference: (the layer is backed off for
        it, its norms moved). They differ when the hold defers a regime: nothing backs off,
        but the window is not a quiet one.

        Accordion picks one of two compression levels per interval: the lighter one while the
        norms move, the usual one once an interval is calm. Stacking a level per firing, each
        lifted only after ``recovery_windows`` quiet windows, read a CNN converging at a
        constant learning rate (norms falling 50-80% per 100 steps) as three regimes in a row
        and moved its largest layer from top-1% to int8: 0.033 -> 0.25 s/step at 10 Mbit/s.
        """
        verdict = self._norms.check_critical(name, grad, compressing)
        cap = self.config.max_backoff
        # The level goes on or off at most once per ``critical_hold_windows`` full windows: each
        # change switches the layer's compressor, and a switch costs its warm start. Without
        # this, a converging CNN (digits at 10 Mbit/s, 50-step windows) alternated critical
        # and calm intervals and moved its conv weight between top-1% and rank 4 six times in
        # 12 windows (2026-11-26).
        changed = self._critical_changed.get(name)
        hold = self.config.critical_hold_windows
        settled = changed is None or self._full_windows - changed >= hold
        if verdict.detail is not None:
            if name in self._critical:
                level = self._effective_level(name, cap)
                detail = f"{verdict.detail}; level stays {level}"
                self._record(step, CRITICAL_REGIME, name, detail, ACTION_CRITICAL_HOLDS)
                return True, True
            if not settled:  # fires at the first window the hold allows, if it persists
                return False, True
            before = self._effective_level(name, cap)
            self._critical.add(name)
            self._critical_changed[name] = self._full_windows
            after = self._effective_level(name, cap)
            action = ACTION_BACK_OFF if after > before else ACTION_AT_MAX
            detail = f"{verdict.detail}; level now {after}"
            self._record(step, CRITICAL_REGIME, name, detail, action)
            return True, True
        if verdict.calm and name in self._critical and settled:
            self._critical.discard(name)
            self._critical_changed[name] = self._full_windows
            level = self._effective_level(name, cap)
            detail = f"a calm interval ends the critical regime; level now {level}"
            self._record(step, RECOVERED, name, detail, ACTION_RECOVER)
        return False, False

    def _check_loss_scale(self, step: int, grad_norms: Mapping[str, float]) -> None:
        """Rescale the references when all layers moved by one power of two (GradScaler)."""
        overflowed = self._overflow_windows > 0
        self._overflow_windows = max(0, self._overflow_windows - 1)
        factor = self._norms.check_loss_scale(grad_norms, overflowed=overflowed)
        if factor is None:
            return
        detail = f"all gradient norms moved by {factor:g}x at once (loss scale change)"
        self._record(step, LOSS_SCALE, None, detail, ACTION_RESCALED)

    def _check_residual(
        self,
        step: int,
        name: str,
        grad: float,
        residual: float | None,
        compressing: bool,
        backed_off: bool,
    ) -> bool:
        """Runaway or non-finite residual; True if the layer had trouble this window."""
        if residual is None:
            return False
        if not math.isfinite(residual):
            self._pending_resets.add(name)
            self._record(step, NONFINITE, name, f"residual norm is {residual}", ACTION_RESET)
            return True
        factor = self.config.residual_factor
        runaway = math.isfinite(grad) and grad > 0.0 and residual > factor * grad
        if not (compressing and runaway):
            return False
        detail = f"|e| {residual:.4g} > {factor:g} x |g| {grad:.4g} (ratio {residual / grad:.3g})"
        if backed_off:  # one level per layer per window: both signals share one disturbance
            self._pending_resets.add(name)
            self._record(step, RESIDUAL_GROWTH, name, detail, ACTION_RESET_ONLY)
        else:
            self._back_off_layer(step, name, detail)
        return True

    def _count_quiet_layer(self, step: int, name: str) -> None:
        own = self._layer_level.get(name, 0)
        if own == 0:
            self._layer_quiet[name] = 0
            return
        quiet = self._layer_quiet.get(name, 0) + 1
        if quiet < self.config.recovery_windows:
            self._layer_quiet[name] = quiet
            return
        self._layer_level[name] = own - 1
        self._layer_quiet[name] = 0
        level = self._effective_level(name, self.config.max_backoff)
        self._record(
            step, RECOVERED, name, f"{quiet} quiet windows; level now {level}", ACTION_RECOVER
        )

    def _record(self, step: int, guard: str, layer: str | None, detail: str, action: str) -> None:
        event = GuardEvent(step=step, guard=guard, layer=layer, detail=detail, action=action)
        if len(self._events) == self._events.maxlen:
            self._events_dropped += 1
        self._events.append(event)
        self._counts[guard] += 1
        level = logging.WARNING if guard == NONFINITE else logging.INFO
        logger.log(
            level,
            "autocomp guards step %d: %s%s: %s -> %s",
            step,
            guard,
            "" if layer is None else f" [{layer}]",
            detail,
            action,
        )
