"""The adaptive window loop: measure, combine across ranks, decide on rank 0, switch together.

Every ``window`` steps, at the start of a training forward (outside the comm hook, after the
previous backward's collectives have all completed):

1. each rank summarizes its window (:class:`~autocomp.profiler.StepProfiler`) into a fixed-size
   vector, and one all-reduce combines them (timings, per-layer norms, errors and costs, loss);
2. rank 0 updates the link fit, the cost model and the convergence guards, runs the policy
   engine, and broadcasts the plan (one spec per parameter, in a fixed order), the list of
   error-feedback resets and the size of the link probe to run at the next boundary (0: none);
3. every rank applies the same plan before the forward continues, so all ranks switch at the
   same step.

When the plan's own transfers are too small to show the bandwidth (heavy compression), rank 0
asks for an active probe: at the next boundary, right after the measurement all-reduce, every
rank runs the same all-reduces of a zero buffer (:class:`~autocomp.link_model.LinkProbe`
sizes it), and the timed pass rides in that boundary's MIN all-reduce to rank 0's meter. A
link that got faster is then noticed although compressed steps cannot show it.

The step counter is the hook's (one per synchronizing backward), so ranks that run the same
training loop reach every boundary at the same step. Forwards without gradient sync (eval,
``no_sync`` accumulation) do not count and never trigger a collective.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from autocomp.compressors import Collective, build_compressor
from autocomp.cost_model import CostModel
from autocomp.distributed import collective_device
from autocomp.guards import ConvergenceGuards
from autocomp.hook import HookState, LayerReplay
from autocomp.link_model import (
    PROBE_PASSES,
    BandwidthMeter,
    LinkEstimate,
    LinkProbe,
    NicCounters,
    latency_hops,
    link_bytes,
)
from autocomp.policy.engine import (
    RULE_INFEASIBLE,
    RULE_KNAPSACK,
    LayerProfile,
    PolicyDecision,
    PolicyEngine,
    StepTiming,
)
from autocomp.policy.payoff import PayoffCheck
from autocomp.policy.rules import PolicyRules
from autocomp.profiler import StepProfiler, WindowProfile
from autocomp.runlog import RunLog

logger = logging.getLogger(__name__)

_TIMING_FIELDS = (
    "step_seconds",
    "backward_seconds",
    "hideable_seconds",
    "comm_busy_seconds",
    "compress_seconds",
    "exposed_seconds",
)
# Per-layer slots in the combined vector: grad norm^2, residual norm^2, has sample,
# rel error, hook seconds, hideable seconds after the layer's bucket is ready.
_PER_LAYER = 6
_HEADER = 1 + len(_TIMING_FIELDS) + 2  # has profile, timings, loss sum, loss count
_MISSING = 1e30  # marks an absent step in the MIN all-reduce of busy periods


@dataclass(slots=True)
class WindowRecord:
    """What one window measured and decided (rank 0 has the full record)."""

    step: int
    """Step at which the new plan takes effect."""
    bandwidth_bytes_per_s: float | None
    """Live link bandwidth fit (None before the first fit)."""
    latency_s: float | None
    """Live per-hop latency fit."""
    nic_bytes_per_s: float | None
    """Cross-check: bytes/s sent on the interface torch.distributed uses (psutil)."""
    step_seconds: float
    backward_seconds: float
    hideable_seconds: float
    comm_busy_seconds: float
    compress_seconds: float
    exposed_seconds: float
    measured_overlap: float
    """1 - exposed / (comm + compression), the same definition the policy predicts."""
    predicted_overlap: float | None
    """What the previous decision predicted for this window."""
    bytes_per_step: float
    """Wire bytes this rank sent per step under the previous plan."""
    uncompressed_bytes_per_step: float
    loss: float | None
    """Mean loss over the window (from ``observe_loss``), all ranks."""
    changes: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Layer -> (old spec, new spec) switched at this boundary."""
    decision: dict[str, Any] | None = None
    """The policy decision (per-layer reasons), rank 0 only."""
    guard_events: list[dict[str, Any]] = field(default_factory=list)
    probe_bytes: int = 0
    """Payload of the active link probe run at this boundary (0: none), per rank."""
    probe_seconds: float | None = None
    """Its timed pass, minimum over ranks."""
    probe_bytes_per_s: float | None = None
    """Link bytes per second the probe achieved (latency included: a lower bound)."""

    def summary(self) -> str:
        """One log line: bandwidth seen, bytes per step, what changed and why."""
        bw = (
            "link n/a"
            if self.bandwidth_bytes_per_s is None
            else f"link {self.bandwidth_bytes_per_s * 8 / 1e6:,.0f} Mbit/s"
        )
        ratio = self.uncompressed_bytes_per_step / max(self.bytes_per_step, 1.0)
        head = (
            f"step {self.step:>6}: {bw}, {self.bytes_per_step / 1e6:,.2f} MB/step "
            f"({ratio:,.1f}x), step {self.step_seconds * 1e3:,.0f} ms, "
            f"overlap {self.measured_overlap:.2f}"
        )
        if self.probe_bytes and self.probe_seconds is not None:
            rate = self.probe_bytes_per_s or 0.0
            head += (
                f", probe {self.probe_bytes / 1e3:,.0f} kB in {self.probe_seconds * 1e3:,.1f} ms"
                f" ({rate * 8 / 1e6:,.0f} Mbit/s)"
            )
        if not self.changes:
            return head + "; plan unchanged"
        reasons = {}
        if self.decision is not None:
            reasons = {d["name"]: d["reason"] for d in self.decision["layers"]}
        parts = [
            f"{name} {old} -> {new}" + (f" ({reasons[name]})" if name in reasons else "")
            for name, (old, new) in sorted(self.changes.items())
        ]
        return head + "; " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class AdaptiveLoop:
    """Owns the profiler, link fit, cost model, guards and policy engine of one wrapped model."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Adaptive-mode settings (all ranks must pass the same values)."""

        target_overlap: float = 0.9
        """Fraction of gradient communication to hide behind backward compute."""
        window: int = 20
        """Steps between decisions."""
        warmup_steps: int = 100
        """Uncompressed steps at the start (the policy preset's value unless overridden)."""
        history: int = 1000
        """Window records kept in memory."""
        sampled_steps: int = 1
        """Steps at the end of each window whose gradient norms and errors are measured (each
        costs a few passes over the gradients, so profiling stays cheap with one)."""
        probe: LinkProbe.Config = field(default_factory=LinkProbe.Config)
        """Active link probe while compressed steps are too small to measure the link."""

    @staticmethod
    def validate(config: Config) -> None:
        """Raise ValueError for settings no run could use."""
        if not 0.0 <= config.target_overlap <= 1.0:
            raise ValueError(f"target_overlap must be in [0, 1], got {config.target_overlap}")
        if config.window < 1:
            raise ValueError(f"window must be >= 1, got {config.window}")
        if config.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {config.warmup_steps}")

    def __init__(
        self,
        ddp: DistributedDataParallel,
        state: HookState,
        rules: PolicyRules,
        pins: Sequence[tuple[str, str]],
        config: Config,
        runlog: RunLog | None = None,
    ) -> None:
        self.validate(config)
        self.runlog = runlog
        """Rank 0's run log (one record per window, operator overrides), or None."""
        self.operator_pins: list[tuple[str, str]] = []
        """Pins posted by an operator (newest first); they win over the code's pins."""
        self.ddp = ddp
        self.state = state
        self.config = config
        self.rules = rules
        self.pins = list(pins)
        self.names = list(state.slots)
        self.profiler = StepProfiler()
        state.profiler = self.profiler
        window = config.window
        # One sample per step: a window of a few steps must be enough for a first fit.
        self.meter = BandwidthMeter(BandwidthMeter.Config(min_samples=min(8, max(2, window))))
        self.probe = LinkProbe(config.probe)
        """Decides (on rank 0) when the next boundary runs a link probe, and how big."""
        self._probe_next = 0  # payload bytes rank 0 asked for at the next boundary
        self._probe_buffer: torch.Tensor | None = None
        self.cost_model = CostModel(CostModel.Config(world_size=state.world_size, refit_every=64))
        if state.rank == 0:  # only rank 0 decides
            _calibrate(self.cost_model, rules.candidates, state.world_size)
        self.engine = PolicyEngine(rules, self.cost_model, target_overlap=config.target_overlap)
        self.payoff = PayoffCheck(PayoffCheck.Config(min_gain=rules.min_gain))
        """Rank 0: holds compression off where measured steps show it does not pay."""
        self._plan_ran: tuple[str, ...] | None = None
        """Rank 0: the plan of the window before the one being closed."""
        # The guards see one observation per window, so step counts become window counts.
        guard_rules = rules.guards
        self.guards = ConvergenceGuards(
            ConvergenceGuards.Config(
                warmup_steps=config.warmup_steps,
                loss_divergence_ratio=guard_rules.loss_spike_ratio,
                loss_ewma_alpha=min(1.0, window / guard_rules.loss_window),
                loss_patience=max(2, math.ceil(guard_rules.loss_window / window)),
                critical_change=guard_rules.accordion_threshold,
                residual_factor=guard_rules.residual_factor,
                max_backoff=guard_rules.max_backoff_levels,
                recovery_windows=max(1, math.ceil(guard_rules.backoff_recovery_steps / window)),
            ),
            layers=self.names,
        )
        self.nic = NicCounters()
        self._nic_last = self.nic.sample()
        self.history: deque[WindowRecord] = deque(maxlen=config.history)
        self.force_none = False
        """Operator override: every layer uncompressed from the next boundary."""
        self.frozen = False
        """Operator override: keep the current plan (measurements continue)."""
        self._rel_errors: dict[str, dict[str, float]] = {name: {} for name in self.names}
        self._grad_norms: dict[str, float] = {}
        self._last_decision: PolicyDecision | None = None
        self.decision_failures = 0
        """Windows whose decision raised (the plan was kept); see the log for tracebacks."""
        self._last_boundary = 0
        self.boundary_seconds = 0.0
        """Wall time this rank spent at window boundaries (measurement all-reduce, decision,
        plan broadcast, probe): the window loop's own cost, reported by the overhead bench."""
        self._loss_sum = 0.0
        self._loss_count = 0
        self._bytes_mark = self._bytes_totals()
        self._handles = [
            ddp.register_forward_pre_hook(self._on_forward),
            ddp.register_forward_hook(self._on_forward_done),
        ]

    # ---- training-loop side -------------------------------------------------------------------

    def observe_loss(self, loss: float | torch.Tensor) -> None:
        """Record this step's loss for the divergence guard (no device sync for tensors)."""
        if isinstance(loss, torch.Tensor):
            loss = float(loss.detach().float().mean())
        self._loss_sum += float(loss)
        self._loss_count += 1

    def _syncs(self, module: torch.nn.Module) -> bool:
        return (
            torch.is_grad_enabled()
            and module.training
            and bool(getattr(module, "require_backward_grad_sync", True))
            and self.state.enabled
        )

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        if not self._syncs(module):
            return
        step = self.state.step
        window = self.config.window
        # Begin first: it closes the previous step, so the window below includes it (and the
        # boundary's own cost is charged to the step it delays).
        self.profiler.begin_step(sample=window - step % window <= self.config.sampled_steps)
        if step > 0 and step % window == 0 and step != self._last_boundary:
            self._last_boundary = step
            started = time.perf_counter()
            self._boundary(step)
            self.boundary_seconds += time.perf_counter() - started

    def _on_forward_done(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._syncs(module):
            self.profiler.forward_done()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.state.profiler = None
        if self.runlog is not None:
            self.runlog.close()

    # ---- the boundary -------------------------------------------------------------------------

    def _bytes_totals(self) -> tuple[int, int]:
        slots = self.state.slots.values()
        return sum(s.bytes_sent for s in slots), sum(s.bytes_raw for s in slots)

    def _local_vector(self, profile: WindowProfile | None) -> torch.Tensor:
        """This rank's window as a fixed-size vector (same layout on every rank, summed)."""
        values = [0.0] * (_HEADER + _PER_LAYER * len(self.names))
        values[_HEADER - 2] = self._loss_sum
        values[_HEADER - 1] = float(self._loss_count)
        if profile is not None:
            values[0] = 1.0
            for i, field_name in enumerate(_TIMING_FIELDS):
                values[1 + i] = getattr(profile.times, field_name)
            bucket_of = self.state.bucket_of()
            bucket_hideable = profile.times.bucket_hideable_seconds
            for i, name in enumerate(self.names):
                base = _HEADER + _PER_LAYER * i
                sample = profile.layer_samples.get(name)
                if sample is not None:
                    values[base] = sample.grad_norm**2
                    values[base + 1] = sample.residual_norm**2
                    values[base + 2] = 1.0
                    values[base + 3] = sample.rel_error or 0.0
                values[base + 4] = profile.layer_seconds.get(name, 0.0)
                bucket = bucket_of.get(name)  # a bucket unseen this window: the whole H
                values[base + 5] = bucket_hideable.get(
                    bucket if bucket is not None else -1, profile.times.hideable_seconds
                )
        return torch.tensor(values, dtype=torch.float64)

    def _boundary(self, step: int) -> None:
        group = self.state.process_group
        world = self.state.world_size
        profile = self.profiler.end_window()
        device = collective_device(group)
        combined = self._local_vector(profile).to(device)
        dist.all_reduce(combined, group=group)
        combined = combined.cpu()
        # Right after a collective the ranks are nearly level: the best moment for a probe.
        # Every rank got the same size from rank 0's last broadcast, so all issue it.
        probe_bytes, self._probe_next = self._probe_next, 0
        probe_local = self._run_probe(probe_bytes, device) if probe_bytes > 0 else _MISSING
        # A collective's time on one rank includes waiting for the slowest peer; the rank that
        # arrived last did not wait, so the minimum over ranks of each step's link busy time is
        # the skew-free one. Steps are aligned across ranks (same step indices). The last slot
        # carries the probe's time.
        window = self.config.window
        busy = torch.full((window + 1,), _MISSING, dtype=torch.float64)
        if profile is not None:
            periods = [sum(s for _, _, s in step) for step in profile.collectives]
            for i, seconds in enumerate(periods[-window:]):
                busy[i] = seconds
        busy[window] = probe_local
        busy = busy.to(device)
        dist.all_reduce(busy, op=dist.ReduceOp.MIN, group=group)
        reduced = busy.cpu().tolist()
        busy_min = [v for v in reduced[:window] if v < _MISSING]
        probe_seconds = reduced[window] if reduced[window] < _MISSING else None
        probe = (probe_bytes, probe_seconds) if probe_bytes > 0 and probe_seconds else None
        self._loss_sum, self._loss_count = 0.0, 0

        sent, raw = self._bytes_totals()
        steps = max(1, step - (self._last_window_step()))
        bytes_per_step = (sent - self._bytes_mark[0]) / steps
        raw_per_step = (raw - self._bytes_mark[1]) / steps
        self._bytes_mark = (sent, raw)

        payload: list[Any] = [None]
        record: WindowRecord | None = None
        if self.state.rank == 0:
            probe_next = 0
            try:
                record, plan, resets, probe_next = self._decide(
                    step, profile, combined, busy_min, world, probe
                )
            except Exception:
                # A policy failure must not strand the other ranks in the broadcast, nor stop
                # training: keep the current plan, say so loudly, and try again next window.
                logger.exception("autocomp: policy decision failed at step %d; plan kept", step)
                record = self._peer_record(step, combined, bytes_per_step, raw_per_step)
                plan = [self.state.slots[name].compressor.spec for name in self.names]
                resets = []
                self.decision_failures += 1
            record.bytes_per_step = bytes_per_step
            record.uncompressed_bytes_per_step = raw_per_step
            payload = [{"plan": plan, "reset": resets, "probe_bytes": probe_next}]
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(payload, src=src, group=group)
        message = payload[0]
        if not isinstance(message, dict) or len(message["plan"]) != len(self.names):
            raise RuntimeError("autocomp: malformed plan broadcast from rank 0")
        self._probe_next = int(message.get("probe_bytes", 0))

        for name in message["reset"]:
            slot = self.state.slots[name]
            slot.residual = None
            slot.state = slot.compressor.init_state(slot.shape, slot.seed, self.state.rank)
        before = {name: self.state.slots[name].compressor.spec for name in self.names}
        assignment = {
            name: build_compressor(spec)
            for name, spec in zip(self.names, message["plan"], strict=True)
        }
        self.state.assign(assignment)
        changes = {
            name: (before[name], spec)
            for name, spec in zip(self.names, message["plan"], strict=True)
            if before[name] != spec
        }
        if record is None:
            record = self._peer_record(step, combined, bytes_per_step, raw_per_step)
        if probe is not None:
            record.probe_bytes, record.probe_seconds = probe
            record.probe_bytes_per_s = link_bytes(Collective.ALL_REDUCE, probe[0], world) / probe[1]
        record.changes = changes
        self.history.append(record)
        if self.runlog is not None:
            self.runlog.append_window(record.to_dict())  # queued: never waits on disk
        if self.state.rank == 0:
            logger.info("autocomp %s", record.summary())

    def _run_probe(self, payload_bytes: int, device: torch.device) -> float:
        """Run the probe's all-reduces on a reused zero buffer; seconds of the timed pass."""
        numel = max(1, payload_bytes // 4)
        buffer = self._probe_buffer
        if buffer is None or buffer.numel() < numel or buffer.device != device:
            buffer = torch.zeros(numel, dtype=torch.float32, device=device)  # sums stay zero
            self._probe_buffer = buffer
        view = buffer[:numel]
        group = self.state.process_group
        seconds = math.inf
        for _ in range(PROBE_PASSES):  # the first primes the path; the last one is timed
            if view.is_cuda:
                torch.cuda.synchronize(view.device)
            started = time.perf_counter()
            dist.all_reduce(view, group=group)
            if view.is_cuda:
                torch.cuda.synchronize(view.device)
            seconds = time.perf_counter() - started
        return seconds

    def _last_window_step(self) -> int:
        return self.history[-1].step if self.history else 0

    def _means(self, combined: torch.Tensor) -> tuple[dict[str, float], float | None]:
        ranks = max(1.0, float(combined[0]))
        timings = {name: float(combined[1 + i]) / ranks for i, name in enumerate(_TIMING_FIELDS)}
        count = float(combined[_HEADER - 1])
        loss = float(combined[_HEADER - 2]) / count if count > 0 else None
        return timings, loss

    def _peer_record(
        self, step: int, combined: torch.Tensor, bytes_per_step: float, raw_per_step: float
    ) -> WindowRecord:
        timings, loss = self._means(combined)
        return WindowRecord(
            step=step,
            bandwidth_bytes_per_s=None,
            latency_s=None,
            nic_bytes_per_s=None,
            **timings,
            measured_overlap=_overlap(timings),
            predicted_overlap=None,
            bytes_per_step=bytes_per_step,
            uncompressed_bytes_per_step=raw_per_step,
            loss=loss,
        )

    def _decide(
        self,
        step: int,
        profile: WindowProfile | None,
        combined: torch.Tensor,
        busy_min: list[float],
        world: int,
        probe: tuple[int, float] | None = None,
    ) -> tuple[WindowRecord, list[str], list[str], int]:
        """Rank 0: the record, the plan, the layers to reset, the next boundary's probe bytes."""
        timings, loss = self._means(combined)
        # Link: rank 0's own steps (every rank sees the same ring), one busy period per step.
        if profile is not None:
            steps = profile.collectives[-self.config.window :]
            for step_collectives, seconds in zip(steps, busy_min, strict=False):
                self.meter.add_period(
                    sum(latency_hops(kind, world) for kind, _, _ in step_collectives),
                    sum(link_bytes(kind, nbytes, world) for kind, nbytes, _ in step_collectives),
                    seconds,
                )
            for step_collectives in profile.collectives:
                for kind, nbytes, seconds in step_collectives:
                    self.cost_model.add_comm_sample(kind, nbytes, world, seconds)
        if probe is not None:  # after the steps: the meter's window is in time order
            payload_bytes, seconds = probe
            self.meter.add_probe(
                latency_hops(Collective.ALL_REDUCE, world),
                link_bytes(Collective.ALL_REDUCE, payload_bytes, world),
                seconds,
            )
        estimate: LinkEstimate | None = self.meter.end_window()
        # Warm-up windows are uncompressed: if even they cannot show the link, probing starts
        # with the first compressed window, whose boundary is the end of warm-up.
        probe_next = self.probe.next_window(
            blind=self.meter.blind and step >= self.config.warmup_steps,
            estimate=estimate,
            world_size=world,
            window_seconds=timings["step_seconds"] * self.config.window,
        )
        if estimate is not None:
            self.cost_model.update_link(estimate)
        nic_now = self.nic.sample()
        nic_rate = self.nic.rate_since(self._nic_last) if self._nic_last is not None else None
        self._nic_last = nic_now

        grad_norms: dict[str, float] = {}
        residual_norms: dict[str, float] = {}
        for i, name in enumerate(self.names):
            base = _HEADER + _PER_LAYER * i
            samples = float(combined[base + 2])
            slot = self.state.slots[name]
            seconds = float(combined[base + 4]) / world
            if seconds > 0 and slot.compressor.name != "none":
                self.cost_model.add_sample(slot.compressor, slot.shape, seconds)
            if samples <= 0:
                continue
            grad_norms[name] = math.sqrt(float(combined[base]) / samples)
            residual_norms[name] = math.sqrt(float(combined[base + 1]) / samples)
            if slot.compressor.name != "none":
                measured = float(combined[base + 3]) / samples
                known = self._rel_errors[name]
                spec = slot.compressor.spec
                known[spec] = measured if spec not in known else 0.5 * (known[spec] + measured)
        # Non-finite norms go to the guards (which react) but never into the policy's weights.
        self._grad_norms.update({n: v for n, v in grad_norms.items() if math.isfinite(v)})

        nonfinite = {name: True for _, name in self.state.nonfinite_events}
        self.state.nonfinite_events.clear()
        if nonfinite:
            # The hook already reset these layers on every rank at the step it happened; the
            # guard records and counts the events, and its reset queue is dropped here.
            self.guards.check_nonfinite(step, nonfinite)
            self.guards.layers_to_reset()
        if loss is not None:
            self.guards.observe_loss(step, loss)
        if grad_norms:
            self.guards.observe_window(step, grad_norms, residual_norms)
        resets = sorted(self.guards.layers_to_reset())
        new_events = [e.to_dict() for e in self.guards.events if e.step == step]

        layouts = self.state.bucket_of()
        layers = [
            LayerProfile(
                name=name,
                shape=self.state.slots[name].shape,
                dtype=self.state.slots[name].dtype,
                grad_norm=self._grad_norms.get(name, 0.0),
                rel_error=dict(self._rel_errors[name]),
                bucket=layouts.get(name),
            )
            for name in self.names
        ]
        ranks = max(1.0, float(combined[0]))
        bucket_hideable: dict[int, float] = {}
        for i, name in enumerate(self.names):
            bucket = layouts.get(name)
            if bucket is not None:
                value = float(combined[_HEADER + _PER_LAYER * i + 5]) / ranks
                bucket_hideable[bucket] = max(0.0, value)
        timing = StepTiming(
            backward_seconds=timings["backward_seconds"],
            hideable_seconds=timings["hideable_seconds"],
            step_seconds=timings["step_seconds"],
            bucket_hideable_seconds=bucket_hideable if float(combined[0]) > 0 else {},
        )
        self._apply_overrides(step)
        previous = self._last_decision
        # The window just measured ran the previous decision's plan; it counts for the payoff
        # check only if the window before ran the same plan (a switch's first steps pay
        # one-off costs, and the first window DDP's bucket rebuild).
        window_index = step // self.config.window
        bandwidth = None if estimate is None else estimate.bandwidth_bytes_per_s
        ran = tuple(self.state.slots[name].compressor.spec for name in self.names)
        settled, self._plan_ran = ran == self._plan_ran, ran
        if settled:
            optimizer_compressed = previous is not None and any(
                layer.rule in (RULE_KNAPSACK, RULE_INFEASIBLE) and layer.spec != "none"
                for layer in previous.layers
            )
            self.payoff.observe(
                window_index, optimizer_compressed, timings["step_seconds"], bandwidth
            )
        hold = self.payoff.hold_reason(window_index, bandwidth)
        if self.frozen and previous is not None:
            plan = [self.state.slots[name].compressor.spec for name in self.names]
            decision = previous
        else:
            decision = self.engine.decide(
                layers,
                timing,
                step,
                world,
                backoff=self.guards.backoff(),
                pins=[*self.operator_pins, *self.pins],
                force_none=self.force_none,
                current={name: self.state.slots[name].compressor.spec for name in self.names},
                hold_reason=hold,
            )
            plan = [decision.layer(name).spec for name in self.names]
            self._last_decision = decision
        record = WindowRecord(
            step=step,
            bandwidth_bytes_per_s=None if estimate is None else estimate.bandwidth_bytes_per_s,
            latency_s=None if estimate is None else estimate.latency_s,
            nic_bytes_per_s=nic_rate,
            **timings,
            measured_overlap=_overlap(timings),
            predicted_overlap=None if previous is None else previous.predicted_overlap,
            bytes_per_step=0.0,
            uncompressed_bytes_per_step=0.0,
            loss=loss,
            decision=decision.to_dict(),
            guard_events=new_events,
        )
        return record, plan, resets, probe_next

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

    # ---- checkpointing ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "meter": self.meter.state_dict(),
            "probe": {**self.probe.state_dict(), "next_bytes": self._probe_next},
            "cost_model": self.cost_model.state_dict(),
            "guards": self.guards.state_dict(),
            "payoff": self.payoff.state_dict(),
            "rel_errors": {k: dict(v) for k, v in self._rel_errors.items()},
            "grad_norms": dict(self._grad_norms),
            "last_boundary": self._last_boundary,
            "force_none": self.force_none,
            "frozen": self.frozen,
            "operator_pins": [list(pin) for pin in self.operator_pins],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.meter.load_state_dict(state["meter"])
        probe = state.get("probe", {})
        self.probe.load_state_dict(probe)
        self._probe_next = int(probe.get("next_bytes", 0))
        self.cost_model.load_state_dict(state["cost_model"])
        self.cost_model.update_link(self.meter.estimate)
        self.guards.load_state_dict(state["guards"])
        self.payoff.load_state_dict(state.get("payoff", {}))
        self._rel_errors = {name: dict(state["rel_errors"].get(name, {})) for name in self.names}
        self._grad_norms = dict(state["grad_norms"])
        self._last_boundary = int(state["last_boundary"])
        self.force_none = bool(state["force_none"])
        self.frozen = bool(state["frozen"])
        self.operator_pins = [(str(g), str(spec)) for g, spec in state.get("operator_pins", [])]


CALIBRATION_SHAPE = torch.Size([1024, 1024])


def _calibrate(cost_model: CostModel, specs: Sequence[str], world_size: int) -> None:
    """Time each candidate's real hook path once here, at the training thread count.

    The cost model's cold-start constants come from another machine and an idle one; without
    this the first decisions try compressors that do not pay, one window each. About a second
    on a 2-core CPU, on rank 0 only.
    """
    generator = torch.Generator().manual_seed(0)
    grad = torch.randn(CALIBRATION_SHAPE, generator=generator) * 1e-3
    for spec in specs:
        compressor = build_compressor(spec)
        if compressor.name == "none":
            continue
        replay = LayerReplay(compressor, grad, gathered=world_size)
        best = math.inf
        for _ in range(3):  # the first call pays one-off costs; keep the fastest
            local, decode = replay.step()
            gathered = compressor.collective is Collective.ALL_GATHER
            best = min(best, local + decode * (world_size if gathered else 1))
        factor = cost_model.calibrate(compressor, CALIBRATION_SHAPE, best)
        logger.debug(
            "autocomp: %s costs %.2f ms per 1M elements here (x%.2f prior)",
            compressor.spec,
            best * 1e3,
            factor,
        )


def _overlap(timings: dict[str, float]) -> float:
    total = timings["comm_busy_seconds"] + timings["compress_seconds"]
    if total <= 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - timings["exposed_seconds"] / total))
