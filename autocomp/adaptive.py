"""The adaptive window loop: measure, combine across ranks, decide on rank 0, switch together.

At a window boundary, at the start of a training forward (outside the comm hook, after the
previous backward's collectives have all completed):

1. each rank summarizes its window (:class:`~autocomp.profiler.StepProfiler`) into a fixed-size
   vector, and one all-reduce combines them (timings, per-layer norms, errors and costs, loss);
   a second, MIN all-reduce carries each step's link busy time (the rank that arrived last
   did not wait, so the minimum is skew-free) and the timed pass of a link probe, if any;
2. rank 0's :class:`~autocomp.planner.WindowPlanner` turns that into the next plan, and rank 0
   broadcasts it (one spec per parameter, in a fixed order) with the list of error-feedback
   resets and the size of the link probe to run at the next boundary (0: none);
3. every rank applies the same plan before the forward continues, so all ranks switch at the
   same step.

Boundaries fall at every multiple of ``window``, at the end of the warm-up, and early: after
the first step (a glance that acts only when communication dominates), at
``first_look_steps`` and at each doubling of it before the first window boundary, so that a
link far slower than the backward is acted on after a few steps instead of a whole window
(the looks after the first two only while rank 0's last broadcast said the warm-up goes on).
While every layer is sent uncompressed and nothing is pending, rank 0's broadcast also
stretches the windows to about ``quiet_window_seconds`` (a quiet stretch), or asks for one
boundary before the regular one (a short window that only measures: an uncompressed
baseline's, ``PlanUpdate.window_steps``). The schedule is a
pure function of the hook's step counter (one per synchronizing backward), the configuration,
which ``wrap`` checks is identical on every rank, and those broadcast values, so all ranks
reach every boundary at the same step. A boundary runs
inside the comm hook, at the first bucket of the step, before any of its collectives: no
forward hook issues collectives, so ``torch.compile`` cannot trace or reorder them, and
frameworks that own the DDP wrapper need nothing but the (state, hook) pair. Backwards without
gradient sync (``no_sync`` accumulation) never reach the hook and never trigger a collective.

When the plan's own transfers are too small to show the bandwidth (heavy compression), rank 0
asks for an active probe: at the next boundary, right after the measurement all-reduce, every
rank runs the same all-reduces of a zero buffer (:class:`~autocomp.link_probe.LinkProbe`
sizes it), and the timed pass rides in that boundary's MIN all-reduce.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from autocomp.calibration import calibrate, calibration_shape_for
from autocomp.compressors import Collective, build_compressor
from autocomp.cost_model import HALF_DTYPES, CostModel, load_regressor
from autocomp.distributed import collective_device
from autocomp.exposure import overlap
from autocomp.hook_layer import is_identity
from autocomp.hook_state import HookState
from autocomp.link_model import link_bytes
from autocomp.link_probe import BOUNDARY_PROBE_PASSES, LinkProbe
from autocomp.opening import EmbeddingRows, gradient_device, untraced
from autocomp.planner import GLANCE_STEP, PlanUpdate, WindowPlanner
from autocomp.policy.rules import PolicyRules
from autocomp.policy.types import NONE_SPEC
from autocomp.probe_runner import ProbeRunner
from autocomp.profiler import StepProfiler, WindowProfile
from autocomp.runlog import RunLog
from autocomp.timing import clock_for
from autocomp.window import WindowMeasurement, WindowRecord, WindowVector, record_window_line

if TYPE_CHECKING:
    from autocomp.hook_hierarchy import HierarchicalReduce

logger = logging.getLogger(__name__)

__all__ = ["AdaptiveLoop", "WindowRecord"]

_MISSING = 1e30  # marks an absent step in the MIN all-reduce of busy periods
MAX_QUIET_WINDOWS = 16
"""Most windows one quiet stretch spans (``Config.quiet_window_seconds``)."""
HISTORY_LAYER_DECISIONS = 100_000
"""Per-layer decisions ``ctl.history`` keeps in memory, newest records first; older records
keep their plan-level figures (the run log has every layer of every window). One decision
over 802 parameters is about 8,700 Python objects and 520 kB: 1,000 windows of them would
hold 520 MB on rank 0, and every full garbage collection would walk them all."""
QUIET_BOUNDARY_SHARE = 0.01
"""A quiet stretch lasts at least rank 0's boundary cost over this share, so that boundaries
that can only confirm an uncompressed plan take about 1% of the run however long the
decision: over 802 parameters it took 100 ms, every 50 steps of 50 ms (4%). A settled
compressed plan's stretch is bounded by the same share (``MAX_SETTLED_WINDOWS``). The cost is
the boundary's whole wall time on rank 0 less its link probe and contention re-read, which
are rationed by their own budgets: on the digits CNN at 200 Mbit/s (19-21 ms steps, 50-step
windows of about 1 s) a boundary took 22.7 ms, of which the decision was 9.7 ms; the rest is
the window's measurement (3.1 ms), its exchange and the plan's broadcast. Counted alone, the
decision never stretched those windows, and the boundaries took 3.8% of the run."""
CONTENTION_REREADS = 3
"""Boundaries at which an unsettled contention reading from the opening (none, or a slowdown
under ``probe_runner.CONTENTION_SETTLED_SLOWDOWN``) is taken again, while some layer is compressed
(where hidden transfers are priced at all), until a re-read reads above none; the larger
reading stands. The opening's probe reads a 2-core pair's contention in one moment; on the
held-out 12-layer GPT at 50 Mbit/s it read none on both ranks in about one opening in eight,
even with its second batch, and that run's step-50 plan put five first-bucket matrices
uncompressed where a reading of 10 ns/B or more keeps one; one opening in twelve read 7.8
ns/B, and its plan put four of them on fp16 (docs/benchmarks-history.md, twenty-seventh session).
Every rank holds the same agreed reading and plan, so every rank re-reads at the same
boundaries."""
CONTENTION_REREAD_SHARE = 0.05
"""A re-read of the contention waits until the re-reads' cost, those done and this one (the
last contention probe's wall time on rank 0), is at most this share of the time since the
opening; rank 0's broadcast says when, so every rank re-reads at the same boundary. The
probe's compute is sized like its transfer, so on a slow link one re-read costs about a
second (14 pairs of ~60 ms loops when the first batch reads none): at 10 Mbit/s the three
re-reads at the looks after steps 1, 2 and 4 took 2.6-2.8 s of a 30 s run of the MLP LM in
5 runs of 6, and 2.5 s of the digits CNN's (docs/benchmarks-history.md, "A probe after every
switch"). Under this share the first comes about 20 s into such a run, a few seconds into
one whose probe is short, and the next once the run is twice as old. A resumed run (no
opening timed) re-reads without waiting."""
QUIET_DECISIONS = 5
"""Decision times whose median stands for it: one slow decision (a first of its kind, a
loaded machine) does not stretch the schedule; on CI's 2 loaded cores one did, past a
boundary a Lightning run's test expects."""
MAX_SETTLED_WINDOWS = 4
"""Most windows a settled compressed plan's stretch spans (``QUIET_BOUNDARY_SHARE``): its
guards and the payoff check judge at each boundary, so their reaction waits at most this many
windows."""
SETTLED_DECISIONS = 2
"""Consecutive decisions that kept a compressed plan before its windows may stretch: the
window just measured then ran the plan unchanged (a settled window, judged by the payoff
check), not the switch into it."""


class AdaptiveLoop:
    """Owns the profiler and the boundary collectives of one wrapped model; rank 0's
    :class:`~autocomp.planner.WindowPlanner` decides."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Adaptive-mode settings (all ranks must pass the same values)."""

        target_overlap: float = 0.9
        """Fraction of gradient communication to hide behind backward compute."""
        window: int = 20
        """Steps between decisions."""
        warmup_steps: int = 100
        """Uncompressed steps at the start (the policy preset's value unless overridden);
        cut short when the first look shows a link much slower than the backward."""
        first_look_steps: int = 2
        """Step of the early boundary: after two measured steps (the first includes DDP's
        bucket rebuild), so that a slow link costs as few uncompressed steps as PyTorch's
        PowerSGD hook takes (the decision comes then if the link is slow). More looks follow
        at each doubling of this step before the first window boundary (4, 8, 16, 32 with a
        50-step window): the first looks' compute still carries one-off costs, falling over
        the first ten steps or so (4 ranks as two nodes at 200 Mbit/s: 0.27-0.31 s at step 2,
        0.18-0.19 s at step 4, 0.15 s later). There an uncompressed step at 2.8x the true
        compute read 2.24-2.27x at step 4 in two recorded runs, just over ``slow_link_ratio``,
        and under it in three more (which ended the warm-up at the look at step 8); with
        looks at 2 and 4 only, the warm-up ran on to step 50 in such runs, 46 uncompressed
        steps at 0.43 s (126-129 steps in 40 s against 154-157)."""
        history: int = 1000
        """Window records kept in memory (the older ones without their per-layer decisions
        past ``HISTORY_LAYER_DECISIONS``)."""
        sampled_steps: int = 2
        """Steps at the end of each window whose gradient norms and errors are measured (each
        costs a few passes over the gradients; more than one keeps the guards and the error
        estimates from reacting to a single step's noise)."""
        probe: LinkProbe.Config = field(default_factory=LinkProbe.Config)
        """Active link probe while compressed steps are too small to measure the link."""
        planner: WindowPlanner.Config | None = None
        """Planner settings beyond the ones above (None: its defaults)."""
        blocking_hook: bool = False
        """The hook returns only once its collectives are done (FSDP's all-reduce hook):
        measured and planned as if no communication hides behind the backward."""
        quiet_window_seconds: float = 2.0
        """While every layer is sent uncompressed and the plan holds (after the warm-up, with
        no probe or reset pending), regular boundaries come about this many seconds apart, in
        the nearest whole number of windows (at most ``MAX_QUIET_WINDOWS``; a window longer
        than two thirds of this gets no stretch), instead of every ``window`` steps. There
        a boundary can only confirm the plan, and it costs a few milliseconds: on the digits
        CNN over loopback (2 gloo ranks) 7 ms every 50 steps of 7 ms, 2% of the run. A
        costlier boundary stretches further (``QUIET_BOUNDARY_SHARE``), and one that costs
        over 1% of a window also stretches a settled compressed plan's windows (see
        ``_quiet_windows``). A link that slows down is then seen this much later. 0: every
        window ends at a boundary."""
        opening: bool = True
        """At step 0, before its first collective, probe the link and decide at once when an
        uncompressed step would be communication-bound (see ``WindowPlanner.open``). Needs
        the model (its first forward is the compute estimate); off with ``make_hook``."""

    @staticmethod
    def validate(config: Config) -> None:
        """Raise ValueError for settings no run could use."""
        if not 0.0 <= config.target_overlap <= 1.0:
            raise ValueError(f"target_overlap must be in [0, 1], got {config.target_overlap}")
        if config.window < 1:
            raise ValueError(f"window must be >= 1, got {config.window}")
        if config.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {config.warmup_steps}")
        if config.first_look_steps < 2:
            raise ValueError(f"first_look_steps must be >= 2, got {config.first_look_steps}")
        if config.sampled_steps < 1:
            raise ValueError(f"sampled_steps must be >= 1, got {config.sampled_steps}")
        if not config.quiet_window_seconds >= 0.0:
            raise ValueError(
                f"quiet_window_seconds must be >= 0, got {config.quiet_window_seconds}"
            )

    def __init__(
        self,
        ddp: torch.nn.Module | None,
        state: HookState,
        rules: PolicyRules,
        pins: Sequence[tuple[str, str]],
        config: Config,
        runlog: RunLog | None = None,
        warmup_peers: Sequence[dist.ProcessGroup] = (),
    ) -> None:
        self.validate(config)
        self.warmup_peers = tuple(warmup_peers)
        """Groups over which the end of the warm-up is agreed with other loops of the same
        synchronous step, one MAX all-reduce each, in order (HSDP: the shard group, then the
        replicate group, so that every replicate group's deciding rank hears every other's).
        Empty: this loop's planner is the only one."""
        self.runlog = runlog
        """Rank 0's run log (one record per window, operator overrides), or None."""
        # No reference to ``ddp`` itself: DDP's C++ reducer holds ``state``, whose step listener
        # is this loop, so a reference back would be a cycle the garbage collector cannot see,
        # and the model (buckets, reducer, process group) would live until interpreter exit.
        self._times_forwards = ddp is not None
        self.state = state
        self.config = config
        self.rules = rules
        self.names = list(state.slots)
        self.device = gradient_device(ddp)
        """Where the gradients live: the profiler's clock and the calibration follow it."""
        self.profiler = StepProfiler(clock_for(self.device), blocking=config.blocking_hook)
        state.profiler = self.profiler
        base = config.planner or WindowPlanner.Config()
        # The controller's own keys win; the rest of a given planner configuration is kept.
        planner_config = replace(
            base,
            target_overlap=config.target_overlap,
            window=config.window,
            warmup_steps=config.warmup_steps,
            probe=config.probe,
        )
        self.planner = WindowPlanner(
            rules,
            self.names,
            {name: slot.shape for name, slot in state.slots.items()},
            {name: slot.dtype for name, slot in state.slots.items()},
            pins,
            planner_config,
            world_size=state.link_world_size,
            device_type=self.device.type,
            runlog=runlog,
        )
        """Rank 0 decides with it; every rank holds one (the same configuration)."""
        # Loops that share boundary-time collectives with peer loops keep one schedule.
        self.planner.shared_schedule = bool(self.warmup_peers) or state.hierarchy is not None
        if state.rank == 0:  # only rank 0 decides
            dense = [slot.shape for slot in state.slots.values() if not slot.sparse]
            calibrate(
                self.planner.cost_model,
                rules.candidates,
                state.link_world_size,
                self.device,
                large_shape=calibration_shape_for(dense),
            )
            load_regressor()  # at set-up, not at the first fit with every rank waiting
        self._probe_next = 0  # payload bytes rank 0 asked for at the next boundary
        self._probe_pass_seconds = 0.0  # one pass of it at rank 0's estimate (0: unknown)
        # Whether rank 0's planner is still in its warm-up (broadcast with each plan): the
        # looks after the first two only serve to end it.
        self._warming = True
        # Regular boundaries before this step are skipped (a quiet stretch: rank 0's last
        # broadcast said every layer stays uncompressed and nothing is pending).
        self._quiet_until = 0
        # A boundary rank 0's last broadcast asked for before the regular one (a short
        # window that only measures, ``PlanUpdate.window_steps``); 0: none.
        self._requested_boundary = 0
        self._prober = ProbeRunner()
        self._contention_probe: tuple[int, float] | None = None
        """The opening probe's (payload bytes, seconds) while its unsettled contention reading
        is to be taken again at a boundary (``CONTENTION_REREADS``), else None."""
        self._contention_rereads = 0
        self._contention_reread_due = False
        """Rank 0's last broadcast allowed a contention re-read at this boundary
        (``CONTENTION_REREAD_SHARE``)."""
        self._opened_at: float | None = None
        """When this rank's opening began (perf_counter): what the re-read's share counts from."""
        self._contention_reread_seconds = 0.0
        """Wall time of this rank's contention re-reads so far."""
        self._vector = WindowVector(self.names)
        self.history: deque[WindowRecord] = deque(maxlen=config.history)
        self.decision_failures = 0
        """Windows whose decision raised (the plan was kept); see the log for tracebacks."""
        self._node_link_warned = False
        self._last_boundary = 0
        self._boundary_costs: deque[float] = deque(maxlen=QUIET_DECISIONS)
        """This rank's last boundaries' wall times, less their probes and contention re-reads
        (rank 0's median sizes a quiet stretch: ``QUIET_BOUNDARY_SHARE``)."""
        self._rationed_seconds = 0.0
        """The current boundary's link probe and contention re-read, rationed apart."""
        self._kept_decisions = 0
        """Rank 0: consecutive decisions that left every layer's spec as it was."""
        self.boundary_seconds = 0.0
        """Wall time this rank spent at window boundaries (measurement all-reduce, decision,
        plan broadcast, probe): the window loop's own cost, reported by the overhead bench."""
        self._plan_after_start: list[str] | None = None
        """The opening's plan while step 0 runs its start plan (``PlanUpdate.start_plan``)."""
        self.opening_seconds = 0.0
        """Wall time of the opening (its link probe and decision), once at step 0; kept apart
        from ``boundary_seconds`` because it does not recur with the windows."""
        self._loss_sum: float | torch.Tensor = 0.0
        self._loss_count = 0
        self._bytes_mark = self._bytes_totals()
        state.step_listener = self.on_step_start
        # Forward ends mark where backwards begin (timing only; no collective here, and
        # compiled code must not trace it: boundaries run in the comm hook instead).
        self._handles = (
            []
            if ddp is None
            else [
                ddp.register_forward_pre_hook(untraced(self._on_forward_start)),
                ddp.register_forward_hook(untraced(self._on_forward_done)),
            ]
        )
        self._forward_started: float | None = None
        self.first_forward_seconds: float | None = None
        """Wall time of the first training forward (the opening's compute estimate)."""
        sparse_names = set(state.sparse_names)
        dense = {
            key: name
            for key, name in state.param_names.items()
            if name in state.slots and name not in sparse_names
        }
        # DDP wraps the model (``.module``); an FSDP2 model is the model itself.
        model = getattr(ddp, "module", ddp)
        self.embedding_rows = None if model is None else EmbeddingRows(model, dense)
        """The embedding tables' row shares of the first forward (the opening's)."""
        self._opened = False

    # ---- the planner's parts, for inspection and tests ------------------------------------------

    @property
    def meter(self) -> Any:
        return self.planner.meter

    @property
    def probe(self) -> LinkProbe:
        return self.planner.probe

    @probe.setter
    def probe(self, value: LinkProbe) -> None:
        self.planner.probe = value

    @property
    def cost_model(self) -> CostModel:
        return self.planner.cost_model

    @property
    def engine(self) -> Any:
        return self.planner.engine

    @property
    def guards(self) -> Any:
        return self.planner.guards

    @property
    def payoff(self) -> Any:
        return self.planner.payoff

    @property
    def force_none(self) -> bool:
        return self.planner.force_none

    @property
    def frozen(self) -> bool:
        return self.planner.frozen

    @property
    def _last_decision(self) -> Any:
        return self.planner.last_decision

    # ---- training-loop side -------------------------------------------------------------------

    def observe_loss(self, loss: float | torch.Tensor) -> None:
        """Record this step's loss for the divergence guard. A tensor is accumulated where it
        lives, without a host sync; the window's sum is read once, at the boundary."""
        if isinstance(loss, torch.Tensor):
            value = loss.detach().float().mean()
            total = self._loss_sum
            self._loss_sum = value if isinstance(total, float) and total == 0.0 else total + value
        else:
            self._loss_sum = self._loss_sum + float(loss)
        self._loss_count += 1

    def is_boundary(self, step: int) -> bool:
        """Whether a boundary runs before the backward of ``step`` (same on every rank)."""
        cfg = self.config
        if step <= 0:
            return False
        looks = self._early_looks()
        # The glance and the first two looks always; the later ones while warming up.
        early = step in looks[:3] or (step in looks and self._warming)
        return (
            (step % cfg.window == 0 and step >= self._quiet_until)
            or (early and step < cfg.warmup_steps)
            or (step == cfg.warmup_steps)
            or step == self._requested_boundary
        )

    def _early_looks(self) -> tuple[int, ...]:
        """The glance and the first looks, doubling up to the first window boundary
        (boundaries inside the warm-up; those after the first two only while it lasts)."""
        looks = [GLANCE_STEP]
        step = self.config.first_look_steps
        while step < self.config.window or len(looks) < 3:
            looks.append(step)
            step *= 2
        return tuple(looks)

    def next_boundary(self, step: int) -> int:
        """The first boundary after ``step``."""
        cfg = self.config
        following = (max(step + 1, self._quiet_until) + cfg.window - 1) // cfg.window * cfg.window
        for special in (*self._early_looks(), cfg.warmup_steps, self._requested_boundary):
            if step < special < following and self.is_boundary(special):
                following = special
        return following

    def on_step_start(self, step: int) -> None:
        """The comm hook's first bucket of ``step`` (every rank, before any collective of the
        step): close the previous step's timeline, and run a boundary when one is due."""
        if not self.state.enabled:
            return
        if self._plan_after_start is not None and step > 0:
            # Step 0 ran the opening's start plan (``opening.warmup_start``); every rank
            # switches here, before step 1's first collective and before its boundary.
            plan, self._plan_after_start = self._plan_after_start, None
            self._assign(plan)
        # Begin first: it closes the previous step, so the window below includes it. The
        # controller's own work is charged to the step it delays, but not to its compute.
        sample = self.next_boundary(step) - step <= self.config.sampled_steps
        self.profiler.begin_step(sample=sample)
        opening = step == 0 and not self._opened
        self._opened = self._opened or opening
        opening = opening and self.config.opening and self._times_forwards
        boundary = self.is_boundary(step) and step != self._last_boundary
        if not (opening or boundary):
            return
        stamp = self.profiler.stamp()
        if opening:
            started = time.perf_counter()
            self._opened_at = started
            self._opening()
            self.opening_seconds = time.perf_counter() - started
        if boundary:
            self._last_boundary = step
            started = time.perf_counter()
            self._rationed_seconds = 0.0
            self._boundary(step)
            elapsed = time.perf_counter() - started
            self.boundary_seconds += elapsed
            self._boundary_costs.append(max(0.0, elapsed - self._rationed_seconds))
        self.profiler.controller_work(stamp)

    def _on_forward_start(self, module: torch.nn.Module, args: Any) -> None:
        if self.first_forward_seconds is None and torch.is_grad_enabled() and module.training:
            self._sync_device()  # once per run: the first forward's time is device time
            self._forward_started = time.perf_counter()

    def _on_forward_done(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.is_grad_enabled() and module.training:
            self.profiler.forward_done()
            if self.first_forward_seconds is None and self._forward_started is not None:
                self._sync_device()
                self.first_forward_seconds = time.perf_counter() - self._forward_started
                if self.embedding_rows is not None:
                    self.embedding_rows.forward_done(output)

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.embedding_rows is not None:
            self.embedding_rows.remove()
        self.state.profiler = None
        self.state.step_listener = None
        if self.runlog is not None:
            self.runlog.close()

    # ---- the boundary -------------------------------------------------------------------------

    def _bytes_totals(self) -> tuple[int, int]:
        slots = self.state.slots.values()
        return sum(s.bytes_sent for s in slots), sum(s.bytes_raw for s in slots)

    def _boundary(self, step: int) -> None:
        group = self.state.process_group
        world = self.state.link_world_size
        profile = self.profiler.end_window()
        device = collective_device(group)
        local_nonfinite = {name for _, name in self.state.nonfinite_events}
        self.state.nonfinite_events.clear()
        sent, raw = self._bytes_totals()
        sketched = self._sketched()
        combined = self._vector.pack(
            profile,
            self._loss_sum,
            self._loss_count,
            local_nonfinite,
            self.state.bucket_of(),
            sent_bytes=sent - self._bytes_mark[0],
            raw_bytes=raw - self._bytes_mark[1],
            sketched=sketched,
            sketch_steps=self.config.sampled_steps,
        ).to(device)
        self._bytes_mark = (sent, raw)
        dist.all_reduce(combined, group=group)
        combined = combined.cpu()
        # Right after a collective the ranks are nearly level: the best moment for a probe.
        # Every rank got the same size from rank 0's last broadcast, so all issue it.
        probe_bytes, self._probe_next = self._probe_next, 0
        probing = time.perf_counter()
        probe_local = (
            self._prober.fastest_all_reduce(
                probe_bytes,
                device,
                self.state.link_group,
                BOUNDARY_PROBE_PASSES - 1,
                expected_pass_seconds=self._probe_pass_seconds or None,
            )
            if probe_bytes > 0
            else _MISSING
        )
        self._rationed_seconds += time.perf_counter() - probing
        window = self.config.window
        busy = torch.full((window + 1,), _MISSING, dtype=torch.float64)
        if profile is not None:
            periods = [sum(s for _, _, s in step) for step in profile.collectives]
            for i, seconds in enumerate(periods[-window:]):
                busy[i] = seconds
        busy[window] = probe_local
        busy = busy.to(device)
        combine_link_busy(busy, group, self._node_group())
        reduced = busy.cpu().tolist()
        busy_min = [v for v in reduced[:window] if v < _MISSING]
        probe_seconds = reduced[window] if reduced[window] < _MISSING else None
        # A node's owners probe their shard groups at once, over the one cross-node link.
        share = self.state.link_share
        probe = (probe_bytes * share, probe_seconds) if probe_bytes > 0 and probe_seconds else None
        contention = self._reread_contention(device)
        self._loss_sum, self._loss_count = 0.0, 0

        steps = max(1, step - self._last_window_step())
        bytes_per_step, raw_per_step = self._vector.bytes_per_step(combined, steps, world)
        nonfinite = self._vector.nonfinite(combined)
        current = {name: self.state.slots[name].compressor.spec for name in self.names}

        payload: list[Any] = [None]
        record: WindowRecord | None = None
        measurement: WindowMeasurement | None = None
        if self.state.rank == 0:
            measurement = self._measurement(
                step, steps, profile, combined, busy_min, probe, nonfinite, sketched
            )
            measurement.bytes_per_step = bytes_per_step
            measurement.uncompressed_bytes_per_step = raw_per_step
        peers_ended = self._agree_warmup_end(measurement)
        if measurement is not None:
            line: dict[str, Any] = {
                "measurement": measurement.to_dict(),
                "current": current,
                "shapes": {name: list(slot.shape) for name, slot in self.state.slots.items()},
            }
            if contention is not None:  # read again before this decision (replays apply it)
                line["contention_seconds_per_byte"] = contention
            failures_before = self.decision_failures
            try:
                self.planner.sparse_bytes = {
                    name: self.state.slots[name].sparse_step_bytes
                    for name in self.state.sparse_names
                }
                update = self.planner.decide(measurement, current, peers_ended=peers_ended)
            except Exception:
                # A policy failure must not strand the other ranks in the broadcast, nor stop
                # training: keep the current plan, say so loudly, and try again next window.
                logger.exception("autocomp: policy decision failed at step %d; plan kept", step)
                record = self._peer_record(step, combined, bytes_per_step, raw_per_step)
                update = PlanUpdate([current[n] for n in self.names], [], 0, record)
                self.decision_failures += 1
                if peers_ended:  # the warm-up flag must stay the same in every group
                    self.planner.warmup_done = True
            record = update.record
            record_window_line({**line, "decision": record.decision})
            kept = self.decision_failures == failures_before and all(
                current[name] == spec for name, spec in zip(self.names, update.plan, strict=True)
            )
            self._kept_decisions = self._kept_decisions + 1 if kept else 0
            payload = [
                {
                    "plan": update.plan,
                    "reset": update.resets,
                    "probe_bytes": update.probe_bytes,
                    "probe_pass_seconds": update.probe_pass_seconds,
                    "warming": not self.planner.warmup_done,
                    "quiet_windows": self._safe_quiet_windows(update, current, measurement),
                    "contention_reread": self._contention_reread_affordable(),
                    "next_boundary": step + update.window_steps if update.window_steps > 0 else 0,
                }
            ]
        message = self._broadcast(payload)
        if not isinstance(message, dict):
            raise RuntimeError("autocomp: malformed plan broadcast from rank 0")
        self._probe_next = int(message.get("probe_bytes", 0))
        self._probe_pass_seconds = float(message.get("probe_pass_seconds", 0.0))
        self._contention_reread_due = bool(message.get("contention_reread", False))
        self._warming = bool(message.get("warming", False))
        quiet = max(1, int(message.get("quiet_windows", 1)))
        self._quiet_until = step + quiet * self.config.window if quiet > 1 else 0
        requested = int(message.get("next_boundary", 0))
        self._requested_boundary = requested if requested > step else 0
        changes = self._apply(message, current)
        if record is None:
            record = self._peer_record(step, combined, bytes_per_step, raw_per_step)
        if probe is not None:
            record.probe_bytes, record.probe_seconds = probe
            record.probe_bytes_per_s = link_bytes(Collective.ALL_REDUCE, probe[0], world) / probe[1]
        record.changes = changes
        if self.state.hierarchy is not None:
            record.node_link_bytes_per_s = _node_link_rate(self.state.hierarchy)
            self._check_node_link(record)
        self._remember(record)
        if self.runlog is not None:
            self.runlog.append_window(record.to_dict())  # queued: never waits on disk
        if self.state.rank == 0:
            quiet_note = (
                f"; plan holds, next boundary at step {self._quiet_until}"
                if self._quiet_until
                else ""
            )
            logger.info("autocomp %s%s", record.summary(), quiet_note)

    def _safe_quiet_windows(
        self, update: PlanUpdate, current: dict[str, str], measurement: WindowMeasurement
    ) -> int:
        """:meth:`_quiet_windows`, or 1 if it raises: the broadcast must still go out."""
        try:
            return self._quiet_windows(update, current, measurement)
        except Exception:
            logger.exception("autocomp: the quiet-stretch check failed; next window as usual")
            return 1

    def _quiet_windows(
        self, update: PlanUpdate, current: dict[str, str], measurement: WindowMeasurement
    ) -> int:
        """Rank 0: how many windows until the next regular boundary (1: the next window).

        More than one only while nothing is left to apply or watch at the next window: the
        warm-up is over, the plan does not change, and no probe, reset, measuring window or
        guard event is pending. Then two stretches:

        - every layer uncompressed (a quiet stretch): a boundary can only confirm the plan, so
          they come about ``quiet_window_seconds`` apart, and at least 100x rank 0's boundary
          cost apart (``QUIET_BOUNDARY_SHARE``);
        - some layer compressed, on a plan kept for ``SETTLED_DECISIONS`` decisions (a settled
          stretch): only the boundaries' share bounds it (at most ``MAX_SETTLED_WINDOWS``),
          since the guards and the payoff check judge such a plan at its boundaries. A
          boundary's cost is mostly its decision on a model with many tensors (which grows with
          the layers times their options: 0.87 s over 800 parameters, 8 buckets, 50 Mbit/s,
          decide_bench; 70-280 ms over a 16-block digits ViT's 196 against 8-12 s windows,
          10-90 ms over the 4-block one's 56 against 4-5 s windows, 1.8% of a run at 500
          Mbit/s), and its measurement, exchange and broadcast on a small one with short steps
          (the digits CNN: 22.7 ms against 1 s windows). A cheap one stretches nothing.

        Only a flat loop whose decision is its own stretches its windows: HSDP's replicate
        groups and the hierarchy's owners keep boundary-time collectives with peer loops, which
        must keep the same schedule.
        """
        seconds = self.config.quiet_window_seconds
        if seconds <= 0 or self.warmup_peers or self.state.hierarchy is not None:
            return 1
        if not self.planner.warmup_done or update.probe_bytes or update.resets:
            return 1
        if update.window_steps:
            return 1
        if update.record.guard_events or self.planner.frozen:
            return 1
        if any(current[name] != spec for name, spec in zip(self.names, update.plan, strict=True)):
            return 1
        window_seconds = measurement.timings["step_seconds"] * self.config.window
        if not window_seconds > 0:
            return 1
        # What the last boundaries cost rank 0 (this one is not over yet), rationed parts
        # aside: it grows with the parameter count through the decision.
        cost = statistics.median(self._boundary_costs) if self._boundary_costs else 0.0
        affordable = cost / QUIET_BOUNDARY_SHARE
        if all(spec == NONE_SPEC for spec in update.plan):
            most, seconds = MAX_QUIET_WINDOWS, max(seconds, affordable)
        elif self._kept_decisions >= SETTLED_DECISIONS:
            most, seconds = MAX_SETTLED_WINDOWS, affordable
        else:
            return 1
        # The nearest whole number of windows, not the floor: floored, every window between
        # 1x and 2x the stretch got no stretch at all (the digits ResNet at 1 Gbit/s, 50
        # windows of 1.03 s against a 2 s stretch: 50 boundaries in 60 s, on "none" from step
        # 16, 1.6 s of them).
        return max(1, min(most, round(seconds / window_seconds)))

    def _agree_warmup_end(self, measurement: WindowMeasurement | None) -> bool:
        """Every rank, while the warm-up lasts: whether any deciding rank of
        ``warmup_peers`` ends it at this boundary.

        With HSDP each replicate group decides for its own shards, but the step is one: a
        group still warming up holds every group to its uncompressed pace (two nodes at
        200 Mbit/s: one group read 2.15x and compressed from step 16, the other read
        1.66-1.97x and stayed uncompressed to step 100). So the first to end it ends it for
        all, and the warm-up flag, which sets the boundary schedule, stays the same on every
        rank of the mesh.
        """
        if not self.warmup_peers or not self._warming:
            return False
        wants = False
        if measurement is not None:
            try:
                wants = self.planner.ends_warmup(measurement)
            except Exception:  # never skip the collective below: the peers would wait
                logger.exception("autocomp: the warm-up check failed; this group keeps it")
        flag = torch.tensor([1.0 if wants else 0.0])
        for group in self.warmup_peers:
            flag = flag.to(collective_device(group))
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item() > 0)

    def _broadcast(self, payload: list[Any]) -> Any:
        """Rank 0's message to every rank of the group."""
        group = self.state.process_group
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(payload, src=src, group=group)
        return payload[0]

    def _apply(
        self, message: dict[str, Any], current: dict[str, str], run: list[str] | None = None
    ) -> dict[str, Any]:
        """Every rank: reset the listed residuals and switch to the broadcast plan (or to
        ``run`` for now, the opening's plan for step 0 alone); the changes of the plan as
        {layer: (old spec, new spec)}."""
        plan = message.get("plan")
        for specs in (plan, run if run is not None else plan):
            if not isinstance(specs, list) or len(specs) != len(self.names):
                raise RuntimeError("autocomp: malformed plan broadcast from rank 0")
        for name in message["reset"]:
            slot = self.state.slots[name]
            slot.residual = None
            slot.state = slot.compressor.init_state(slot.shape, slot.seed, self.state.rank)
        self._assign(plan if run is None else run)
        return {
            name: (current[name], spec)
            for name, spec in zip(self.names, plan, strict=True)
            if current[name] != spec
        }

    def _assign(self, plan: Sequence[str]) -> None:
        self.state.assign(
            {name: build_compressor(spec) for name, spec in zip(self.names, plan, strict=True)}
        )

    def _opening(self) -> None:
        """Step 0, before any of its collectives: probe the link (:class:`ProbeRunner`), and
        let rank 0 decide whether the first step already compresses
        (``WindowPlanner.open``)."""
        group = self.state.link_group
        device = collective_device(group)
        # A sparse gradient sends the rows a step touched, unknown before step 0 runs; it is
        # never compressed, so the opening leaves it out (priced at 0 bytes) rather than
        # count its dense table: a large sparse embedding would otherwise make any link
        # look slow.
        sparse = set(self.state.sparse_names)
        self.planner.sparse_bytes = dict.fromkeys(sparse, 0)
        if self.embedding_rows is not None:
            self.planner.row_shares = dict(self.embedding_rows.shares)
        raw = sum(
            slot.shape.numel() * slot.dtype.itemsize
            for name, slot in self.state.slots.items()
            if name not in sparse
        )
        node = self._node_group()
        agreed = self._prober.opening(
            raw,
            self.first_forward_seconds,
            device,
            group,
            opening_ratio=self.planner.config.opening_ratio,
            node=node,
        )
        slowest_forward, missing = agreed.slowest_forward_seconds, agreed.forward_missing
        probe = (agreed.payload_bytes * self.state.link_share, agreed.seconds)
        small = agreed.latency_probe
        small_probe = None if small is None else (small[0] * self.state.link_share, small[1])
        current = {name: self.state.slots[name].compressor.spec for name in self.names}
        payload: list[Any] = [None]
        update: PlanUpdate | None = None
        self.planner.cost_model.update_contention(agreed.contention_seconds_per_byte)
        if not agreed.contention_settled and agreed.seconds > 0:
            self._contention_probe = (agreed.payload_bytes, agreed.seconds)
            self._contention_rereads = CONTENTION_REREADS
        for dtype, cost in zip(HALF_DTYPES, agreed.half_sum_seconds_per_element, strict=True):
            self.planner.cost_model.update_half_sum(dtype, cost)
        if self.state.rank == 0:
            record_window_line(
                {
                    "opening": {
                        "probe": list(probe),
                        "small_probe": None if small_probe is None else list(small_probe),
                        "forward_seconds": slowest_forward,
                        "contention_seconds_per_byte": agreed.contention_seconds_per_byte,
                        "half_sum_seconds_per_element": list(agreed.half_sum_seconds_per_element),
                        "row_shares": dict(self.planner.row_shares),
                    }
                }
            )
            try:
                if not missing:
                    update = self.planner.open(
                        probe, slowest_forward, self.state.link_world_size, current, small_probe
                    )
            except Exception:
                logger.exception("autocomp: the opening decision failed; plan kept")
                self.decision_failures += 1
            if update is not None:
                payload = [
                    {"plan": update.plan, "reset": update.resets, "start": update.start_plan}
                ]
        message = self._broadcast(payload)
        if message is None:
            return
        start = message.get("start")
        changes = self._apply(message, current, run=start)
        if start is not None:
            self._plan_after_start = list(message["plan"])
        # Rank 0 keeps the full record, as at every boundary.
        record = update.record if update is not None else WindowRecord.opening(float(raw))
        record.probe_bytes, record.probe_seconds = probe
        record.probe_bytes_per_s = link_bytes(
            Collective.ALL_REDUCE, probe[0], self.state.link_world_size
        ) / max(probe[1], 1e-12)
        record.changes = changes
        self._remember(record)
        if self.runlog is not None:
            self.runlog.append_window(record.to_dict())
        if self.state.rank == 0:
            logger.info("autocomp %s", record.summary())

    def _node_group(self) -> dist.ProcessGroup | None:
        """The ranks of this node that share its one cross-node link (a hierarchy of more
        than one rank per node), else None: the link probes agree over it too."""
        hierarchy = self.state.hierarchy
        if hierarchy is not None and hierarchy.local_world_size > 1:
            return hierarchy.groups.intra
        return None

    def _reread_contention(self, device: torch.device) -> float | None:
        """At a boundary, the opening's contention probe again when its reading was unsettled
        and some layer is compressed (``CONTENTION_REREADS``); the reading then in force, or
        None when none was taken. Every rank holds the same reading, plan and count, so all
        take it alike; the larger of the two readings stands in every rank's cost model (a
        quiet moment can only hide contention, not add it)."""
        if self._contention_probe is None or not self._contention_reread_pending:
            return None
        if not self._contention_reread_due:
            return None  # not yet affordable (CONTENTION_REREAD_SHARE); rank 0 says when
        # The plan is the same on every rank that shares the probe's collectives: one DDP
        # group's (broadcast by its rank 0), with the node's groups under a hierarchy. With
        # HSDP each replicate group has its own plan, but no node group joins the probe there.
        if all(slot.compressor.spec == NONE_SPEC for slot in self.state.slots.values()):
            return None  # nothing compressed: no hidden transfer is being priced
        payload, seconds = self._contention_probe
        reading = self._prober.contention(
            payload, seconds, device, self.state.link_group, self._node_group()
        ).seconds_per_byte
        self._contention_reread_seconds += self._prober.last_contention_seconds or 0.0
        self._rationed_seconds += self._prober.last_contention_seconds or 0.0
        self._contention_rereads -= 1
        if reading > 0.0 or self._contention_rereads == 0:
            self._contention_probe = None
        opened = self.planner.cost_model.contention_seconds_per_byte
        if reading > opened:
            self.planner.cost_model.update_contention(reading)
            if self.state.rank == 0:
                logger.info(
                    "autocomp: transfer contention read again at a boundary: %.3g ns per byte "
                    "sent (the opening read %.3g)",
                    reading * 1e9,
                    opened * 1e9,
                )
        return max(reading, opened)

    @property
    def _contention_reread_pending(self) -> bool:
        """An unsettled opening reading still has re-reads left (``CONTENTION_REREADS``)."""
        return self._contention_probe is not None and self._contention_rereads > 0

    def _contention_reread_affordable(self) -> bool:
        """Rank 0: whether the next boundary may re-read the contention: the re-reads so far
        and one more at the last probe's cost within ``CONTENTION_REREAD_SHARE`` of the time
        since the opening (or no opening timed: nothing to ration by)."""
        if not self._contention_reread_pending:
            return False
        cost = self._prober.last_contention_seconds
        if self._opened_at is None or cost is None:
            return True
        spent = self._contention_reread_seconds + cost
        return spent <= CONTENTION_REREAD_SHARE * (time.perf_counter() - self._opened_at)

    def _remember(self, record: WindowRecord) -> None:
        """Append ``record`` to the history; past ``HISTORY_LAYER_DECISIONS`` per-layer
        decisions, the older records lose theirs. A trimmed decision is a new dict, so a
        record still queued for the run log keeps every layer."""
        self.history.append(record)
        kept = 0
        for older in reversed(self.history):
            decision = older.decision
            if not decision or "layers" not in decision:
                if decision and decision.get("layers_trimmed") is not None:
                    break  # everything older was trimmed before
                continue
            kept += len(decision["layers"])
            if kept > HISTORY_LAYER_DECISIONS and older is not record:
                older.decision = {
                    **{k: v for k, v in decision.items() if k != "layers"},
                    "layers_trimmed": len(decision["layers"]),
                }

    def _check_node_link(self, record: WindowRecord) -> None:
        """Say so (once, rank 0) when the link inside a node is not much faster than the one
        between nodes: the hierarchy then sends uncompressed over a slow link."""
        node, cross = record.node_link_bytes_per_s, record.bandwidth_bytes_per_s
        hierarchy = self.state.hierarchy
        if self._node_link_warned or self.state.rank != 0 or node is None or cross is None:
            return
        if hierarchy is not None and node < hierarchy.min_advantage * cross:
            self._node_link_warned = True
            logger.warning(
                "autocomp: the link inside a node (%.0f Mbit/s) is not much faster than the one "
                "between nodes (%.0f Mbit/s); the hierarchy reduces inside the node "
                "uncompressed. Consider hierarchy=False (compress every rank's traffic).",
                node * 8 / 1e6,
                cross * 8 / 1e6,
            )

    def _measurement(
        self,
        step: int,
        steps: int,
        profile: WindowProfile | None,
        combined: torch.Tensor,
        busy_min: list[float],
        probe: tuple[int, float] | None,
        nonfinite: list[str],
        sketched: list[str],
    ) -> WindowMeasurement:
        """Rank 0: the combined vector as the planner's input."""
        world = self.state.link_world_size  # hook costs: summed over the layer's owners
        timings, loss = self._vector.means(combined)
        specs = {name: self.state.slots[name].compressor.spec for name in self.names}
        layers = self._vector.layers(
            combined,
            specs,
            self.state.bucket_of(),
            world,
            sketched,
            sketch_steps=self.config.sampled_steps,
        )
        return WindowMeasurement(
            step=step,
            world_size=world,
            window_steps=steps,
            profiled_ranks=round(float(combined[0])),
            timings=timings,
            loss=loss,
            layers=layers,
            busy_min=busy_min,
            collectives=[] if profile is None else profile.collectives[-self.config.window :],
            probe=probe,
            nonfinite=nonfinite,
        )

    def _sketched(self) -> list[str]:
        """The layers whose error sketches this window's vector carries: the compressed ones
        (the plan, and so the list, is the same on every rank)."""
        if not self.state.sketch_errors:
            return []
        slots = self.state.slots
        return [name for name in self.names if not is_identity(slots[name].compressor)]

    def _last_window_step(self) -> int:
        return self.history[-1].step if self.history else 0

    def _peer_record(
        self, step: int, combined: torch.Tensor, bytes_per_step: float, raw_per_step: float
    ) -> WindowRecord:
        timings, loss = self._vector.means(combined)
        return WindowRecord(
            step=step,
            bandwidth_bytes_per_s=None,
            latency_s=None,
            nic_bytes_per_s=None,
            **timings,
            measured_overlap=overlap(
                timings["exposed_seconds"],
                timings["comm_busy_seconds"],
                timings["compress_seconds"],
            ),
            predicted_overlap=None,
            bytes_per_step=bytes_per_step,
            uncompressed_bytes_per_step=raw_per_step,
            loss=loss,
        )

    # ---- checkpointing ------------------------------------------------------------------------

    def loop_state_dict(self) -> dict[str, Any]:
        """The counters every rank holds alike (the planner's state is saved apart)."""
        return {
            "probe_next_bytes": self._probe_next,
            "probe_pass_seconds": self._probe_pass_seconds,
            "last_boundary": self._last_boundary,
            "warming": self._warming,
            "quiet_until": self._quiet_until,
            "kept_decisions": self._kept_decisions,  # rank 0's; only rank 0 reads it
            "requested_boundary": self._requested_boundary,
            "contention_probe": None
            if self._contention_probe is None
            else list(self._contention_probe),
            "contention_rereads": self._contention_rereads,
            "plan_after_start": self._plan_after_start,
        }

    def load_loop_state_dict(self, state: dict[str, Any]) -> None:
        self._probe_next = int(state.get("probe_next_bytes", 0))
        self._probe_pass_seconds = float(state.get("probe_pass_seconds", 0.0))
        self._last_boundary = int(state["last_boundary"])
        self._warming = bool(state.get("warming", True))
        self._quiet_until = int(state.get("quiet_until", 0))
        self._kept_decisions = int(state.get("kept_decisions", 0))
        self._requested_boundary = int(state.get("requested_boundary", 0))
        probe = state.get("contention_probe")
        self._contention_probe = None if probe is None else (int(probe[0]), float(probe[1]))
        self._contention_rereads = int(state.get("contention_rereads", 0))
        after_start = state.get("plan_after_start")
        if after_start is not None and (
            not isinstance(after_start, list) or len(after_start) != len(self.names)
        ):
            raise ValueError(
                f"plan_after_start must list {len(self.names)} specs, got {after_start!r}"
            )
        self._plan_after_start = None if after_start is None else [str(s) for s in after_start]


def combine_link_busy(
    busy: torch.Tensor, group: dist.ProcessGroup | None, node: dist.ProcessGroup | None
) -> None:
    """Combine per-step link busy times over ranks, in place, on every rank.

    The MIN over ranks is skew-free: the rank that arrived last at a collective did not wait
    for the others. With a hierarchy a node's owners send their shards over the one
    cross-node link at once, and the node's transfer (its bytes are counted x link_share)
    ends with its last owner's, so ``node`` (the ranks of this rank's node) takes the MAX
    first. The MIN alone took the owner that got the link first, and read a 200 Mbit/s
    link at 280 (two nodes of two ranks, 2026-11-23). Absent entries hold a huge value.
    """
    if node is not None:
        dist.all_reduce(busy, op=dist.ReduceOp.MAX, group=node)
    dist.all_reduce(busy, op=dist.ReduceOp.MIN, group=group)


def _node_link_rate(hierarchy: HierarchicalReduce) -> float | None:
    """Median bus bytes/s of this rank's intra-node collectives since the last window."""
    samples = hierarchy.take_intra_samples()
    if not samples:
        return None
    parts = hierarchy.local_world_size
    # A ring reduce-scatter or all-gather moves (L - 1) / L of the full buffer per rank.
    rates = [size * (parts - 1) / parts / seconds for size, seconds in samples]
    return statistics.median(rates)
