"""The policy engine: which compressor every layer uses for the next steps, and why.

A decision has two stages. Rules come first, in this order, each recording its reason:
warmup, the operator's force-none override, pins (code pins, then the policy's; first match
wins), tiny tensors, 1-D tensors, a single rank, no bandwidth measured yet, a fast link. The
layers no rule claims go to the budgeted optimizer (:mod:`autocomp.policy.optimizer`) with
their usable candidates (those that would compress the layer into fewer bytes than 'none'),
minus the heaviest ones a guard back-off forbids. It picks per layer the candidate with the
least total compression error that keeps the predicted communication hidden behind backward.
Last, the ``min_gain`` rule: if that plan cuts the predicted step (exposed communication plus
compression work) by less than ``min_gain`` of it, those layers stay uncompressed.

Overlap. Let C be the step's communication service time: the sum over the collectives of the
step of their predicted time, plus the compression work on the critical path. Let H be the
hideable backward time: the backward compute that remains once the first gradient bucket is
ready, and H_b the part left once bucket b is ready (0 for the last one). The link serves
buckets in the order DDP hands them over, so the communication of bucket b and of every
bucket after it (S_b) has H_b to hide in, and

    exposed E = max(0, max_b (S_b - H_b))        overlap = 1 - E / C   (1.0 when C == 0)

(with one bucket, or no per-bucket timeline, E = max(0, C - H)). Meeting a target overlap t
(0 < t <= 1) means E <= (1 - t) C: for the first bucket, S = C, that is C <= H / t, the
optimizer's budget; for each later bucket a cap on a running total, S_b <= H_b + (1 - t) C,
which the optimizer takes in reverse ready order (see ``_solve`` for how C on the right is
bounded). Without the later caps a plan can look hidden while the last bucket's
communication, ready only when the backward ends, is all exposed (the LM of the benchmark
holds a third of its bytes there). Budget and caps are net of everything the optimizer does
not choose: the rule-decided layers' time and the per-bucket latency below. A target of 0
puts no bound on C (every layer gets its least-error option, normally 'none').

Latency. Each layer's time is its collective's bandwidth term, ``comm_seconds(collective,
bytes) - comm_seconds(collective, 0)``, plus its compression time. Latency is charged as:

* a fixed per-step term: one all-reduce latency per DDP bucket, which the hook issues for
  every bucket whatever the plan. Buckets are counted from ``LayerProfile.bucket`` when every
  layer has one, else estimated as ceil(uncompressed bytes / ``Config.bucket_cap_bytes``);
* one extra latency of its collective for every layer whose option needs a collective that a
  bucket would not issue anyway (an all-gather, or an all-reduce in another payload dtype,
  e.g. fp16). The hook issues at most one such collective per bucket and kind, so this is an
  upper bound: a plan that meets the budget as predicted also meets it with shared latency.

Errors. A layer's option has the predicted squared error ``rel_error^2 * grad_norm^2``, so
layers with large gradients weigh more. ``rel_error`` is the profiler's measured value for
that spec when there is one, else the :class:`ErrorPriors` value, scaled by how the layer's
measured specs of the same family compare with their priors (geometric mean of the ratios);
failing those, by the layer's other measured specs, but only upwards (a layer hard for one
family is likely hard for all; one that suits top-k says nothing good about PowerSGD). A
biased compressor's scaled prior is capped at 1, the error of sending nothing.

Determinism: identical inputs (including the cost model's answers) give identical decisions;
rank 0 decides and broadcasts, and tests rely on it.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import torch

from autocomp.compressors import (
    QSGD,
    BFloat16,
    Collective,
    Compressor,
    Float16,
    Int8,
    NoCompression,
    PowerSGD,
    RandomK,
    Sign,
    TopK,
    build_compressor,
)
from autocomp.compressors.powersgd import matrix_shape
from autocomp.policy.optimizer import (
    METHOD_MIN_TIME,
    BudgetOptimizer,
    BudgetSolution,
    LayerOption,
    cap_excess,
)
from autocomp.policy.rules import Pin, PolicyRules

logger = logging.getLogger(__name__)

__all__ = [
    "CostModelProtocol",
    "ErrorPriors",
    "LayerDecision",
    "LayerProfile",
    "PolicyDecision",
    "PolicyEngine",
    "StepTiming",
]

NONE_SPEC = "none"

# Machine-readable names of what decided a layer (LayerDecision.rule).
RULE_WARMUP = "warmup"
RULE_FORCE_NONE = "force_none"
RULE_PIN = "pin"
RULE_TOO_SMALL = "too_small"
RULE_ONE_D = "1d"
RULE_SINGLE_RANK = "single_rank"
RULE_NO_BANDWIDTH = "no_bandwidth"
RULE_FAST_LINK = "fast_link"
RULE_KNAPSACK = "knapsack"
RULE_INFEASIBLE = "infeasible"
RULE_NO_GAIN = "no_gain"

_NO_BACKOFF: Mapping[str, int] = MappingProxyType({})


@runtime_checkable
class CostModelProtocol(Protocol):
    """What the engine needs from a cost model (the measured link and compute costs)."""

    def comm_seconds(self, collective: Collective, payload_bytes: int, world_size: int) -> float:
        """Predicted time of one collective carrying ``payload_bytes`` per rank."""
        ...

    def compress_seconds(self, compressor: Compressor, shape: torch.Size) -> float:
        """Predicted compression work on the critical path for one tensor of ``shape``."""
        ...

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        """Measured link bandwidth, or None before any measurement."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerProfile:
    """What the profiler knows about one parameter's gradient."""

    name: str
    """Qualified parameter name."""
    shape: torch.Size
    """Gradient shape."""
    dtype: torch.dtype = torch.float32
    """Gradient dtype as it sits in the DDP bucket."""
    grad_norm: float
    """Recent L2 norm of the (averaged) gradient; weighs the layer's error."""
    rel_error: Mapping[str, float] = field(default_factory=dict)
    """Measured ||C(g) - g|| / ||g|| by spec; missing specs fall back to :class:`ErrorPriors`."""
    bucket: int | None = None
    """DDP bucket index when known (counts the per-bucket latency exactly)."""

    def __post_init__(self) -> None:
        if not isinstance(self.shape, torch.Size):
            object.__setattr__(self, "shape", torch.Size(self.shape))
        if not math.isfinite(self.grad_norm) or self.grad_norm < 0:
            raise ValueError(f"{self.name}: grad_norm must be finite and >= 0")
        for spec, value in self.rel_error.items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{self.name}: rel_error[{spec!r}] must be finite and >= 0")

    @property
    def numel(self) -> int:
        return self.shape.numel()

    @property
    def raw_bytes(self) -> int:
        """Bytes an uncompressed all-reduce sends for this layer."""
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTiming:
    """Measured timing of recent steps (seconds)."""

    backward_seconds: float
    """Backward compute time."""
    hideable_seconds: float
    """Backward time left once the first gradient bucket is ready: what comm can hide behind."""
    step_seconds: float
    """Whole step, wall clock."""
    bucket_hideable_seconds: Mapping[int, float] = field(default_factory=dict)
    """Per DDP bucket index: backward compute left once that bucket is ready (0 for the last
    one). Empty: every layer is treated as ready when the first bucket is (one group)."""

    def __post_init__(self) -> None:
        for name in ("backward_seconds", "hideable_seconds", "step_seconds"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"StepTiming.{name} must be finite and >= 0, got {value!r}")
        for index, value in self.bucket_hideable_seconds.items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"StepTiming.bucket_hideable_seconds[{index}] must be finite and >= 0, "
                    f"got {value!r}"
                )


def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise linear in log(x) through ``points`` (sorted by x), clamped at both ends."""
    xs = [math.log(p[0]) for p in points]
    lx = math.log(x)
    if lx <= xs[0]:
        return points[0][1]
    if lx >= xs[-1]:
        return points[-1][1]
    i = bisect.bisect_right(xs, lx)
    t = (lx - xs[i - 1]) / (xs[i] - xs[i - 1])
    return points[i - 1][1] + t * (points[i][1] - points[i - 1][1])


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorPriors:
    """Relative one-step error ||C(g) - g|| / ||g|| by compressor family, before measurement.

    Rough values measured with ``autocomp.bench.compressors.relative_error`` on its synthetic
    gradient-like tensors (Gaussian low-rank part with a 1/i spectrum plus Student-t noise,
    log-normal row/column scales; 512x128 to 4096x1024 and 256x256x3x3). On pure Gaussian
    noise top-k and PowerSGD do much worse (rank 4 ~0.99); real gradients are closer to the
    synthetic ones. A profiler measurement for the spec always overrides the prior.
    """

    fp16: float = 2.5e-4
    """Round to half precision."""
    bf16: float = 1.7e-3
    """Round to bfloat16."""
    int8_by_chunk: tuple[tuple[float, float], ...] = ((64, 0.009), (256, 0.013), (4096, 0.029))
    """(chunk, error) points: a larger chunk shares one max-abs scale over more outliers."""
    qsgd_scale: float = 0.4
    """QSGD error ~ min(scale * sqrt(chunk) / levels, sqrt_scale * (sqrt(chunk) / levels)^0.5)."""
    qsgd_sqrt_scale: float = 0.8
    """Second regime of the QSGD formula, for few levels."""
    sign: float = 0.8
    """1-bit sign with the chunk's RMS as its scale (0.77-0.85 on the synthetic tensors at the
    default chunk; Gaussian noise alone gives sqrt(2 - 2 sqrt(2/pi)) = 0.64)."""
    topk_by_ratio: tuple[tuple[float, float], ...] = (
        (1e-4, 0.98),
        (1e-3, 0.93),
        (1e-2, 0.79),
        (3e-2, 0.66),
        (1e-1, 0.46),
        (3e-1, 0.24),
        (1.0, 0.0),
    )
    """(ratio, error) points, interpolated in log(ratio)."""
    powersgd_by_rank: tuple[tuple[float, float], ...] = (
        (1, 0.72),
        (2, 0.65),
        (4, 0.57),
        (8, 0.52),
        (16, 0.48),
        (32, 0.44),
        (64, 0.38),
    )
    """(rank, error) points after warm-up, scaled by sqrt(1 - rank / min(rows, cols))."""
    unknown: float = 0.5
    """Any compressor family not listed (user-registered ones)."""

    def rel_error(self, compressor: Compressor, shape: torch.Size) -> float:
        """The prior relative error of ``compressor`` on a gradient of ``shape``."""
        config = compressor.config
        match compressor:
            case NoCompression():
                return 0.0
            case Float16():
                return self.fp16
            case BFloat16():
                return self.bf16
            case Int8():
                return _interpolate(self.int8_by_chunk, float(config["chunk"]))
            case QSGD():
                spread = math.sqrt(min(int(config["chunk"]), max(1, shape.numel())))
                spread /= int(config["levels"])
                return min(self.qsgd_scale * spread, self.qsgd_sqrt_scale * math.sqrt(spread))
            case Sign():
                return self.sign
            case TopK():
                return _interpolate(self.topk_by_ratio, float(config["ratio"]))
            case RandomK():
                ratio = float(config["ratio"])
                # Unbiased: variance (1/ratio - 1); biased: the unsent fraction is the error.
                return math.sqrt(1 / ratio - 1) if config["unbiased"] else math.sqrt(1 - ratio)
            case PowerSGD():
                if not compressor.compresses(shape):
                    return 0.0
                rank = int(config["rank"])
                smallest = min(matrix_shape(shape))
                base = _interpolate(self.powersgd_by_rank, float(rank))
                return base * math.sqrt(max(0.0, 1.0 - rank / smallest))
            case _:
                return self.unknown


@lru_cache(maxsize=1024)
def _built(spec: str) -> Compressor:
    """Compressors are immutable configurations: one instance per spec serves every call."""
    return build_compressor(spec)


def _canonical(spec: str) -> str:
    return _built(spec).spec


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerDecision:
    """The compressor chosen for one layer, with its predicted cost and the reason."""

    name: str
    """Qualified parameter name."""
    spec: str
    """Canonical compressor spec."""
    reason: str
    """Why, in words (specific: numbers, the rule, the runner-up)."""
    rule: str
    """What decided, machine-readable: warmup, force_none, pin, too_small, 1d, single_rank,
    no_bandwidth, fast_link, knapsack, infeasible or no_gain."""
    predicted_seconds: float
    """Time this layer adds to C (communication bandwidth term, extra latency, compression)."""
    predicted_wire_bytes: int
    """Bytes this rank sends for this layer per step."""
    predicted_error: float
    """Predicted squared error rel_error^2 * grad_norm^2."""
    runner_up: str | None = None
    """Best alternative spec (optimizer layers only)."""
    runner_up_seconds: float | None = None
    """The runner-up's predicted seconds for this layer."""
    runner_up_error: float | None = None
    """The runner-up's predicted squared error for this layer."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "spec": self.spec,
            "reason": self.reason,
            "rule": self.rule,
            "predicted_seconds": self.predicted_seconds,
            "predicted_wire_bytes": self.predicted_wire_bytes,
            "predicted_error": self.predicted_error,
            "runner_up": self.runner_up,
            "runner_up_seconds": self.runner_up_seconds,
            "runner_up_error": self.runner_up_error,
        }


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyDecision:
    """One plan for all layers, with the plan-level prediction it was chosen by."""

    step: int
    """Step the decision was made at."""
    policy: str
    """Name of the rules used."""
    layers: tuple[LayerDecision, ...]
    """Per layer, in the order given to ``decide``."""
    world_size: int
    """Ranks the prediction assumed."""
    bandwidth_bytes_per_s: float | None
    """The cost model's bandwidth at decision time."""
    target_overlap: float
    """Target t."""
    hideable_seconds: float
    """H: backward time communication can hide behind."""
    budget_seconds: float
    """H / t: the most C may be for the target to be met (inf when t == 0)."""
    latency_seconds: float
    """Fixed per-step latency term included in C (one all-reduce latency per bucket)."""
    buckets: int
    """Buckets that term counts."""
    predicted_comm_seconds: float
    """C: latency term plus every layer's predicted seconds."""
    predicted_exposed_seconds: float
    """E: the most, over buckets, by which the communication of that bucket and the ones
    after it exceeds the backward left once it is ready (``max(0, C - H)`` for one group)."""
    predicted_overlap: float
    """1 - exposed / C (1.0 when C == 0)."""
    predicted_error: float
    """Sum of the layers' predicted squared errors."""
    predicted_wire_bytes: int
    """Bytes this rank sends per step, all layers."""
    feasible: bool
    """Whether the prediction meets the target (E <= (1 - t) / t x H, i.e. C <= H / t for one
    group)."""
    solver: str
    """How the optimizer layers were solved ('' when every layer was rule-decided)."""

    @property
    def plan(self) -> dict[str, str]:
        """Spec by layer name, ready for ``HookState.assign`` (after ``build_compressor``)."""
        return {layer.name: layer.spec for layer in self.layers}

    def layer(self, name: str) -> LayerDecision:
        for decision in self.layers:
            if decision.name == name:
                return decision
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly (strict JSON: an infinite budget becomes None)."""
        return {
            "step": self.step,
            "policy": self.policy,
            "world_size": self.world_size,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "target_overlap": self.target_overlap,
            "hideable_seconds": self.hideable_seconds,
            "budget_seconds": _finite_or_none(self.budget_seconds),
            "latency_seconds": self.latency_seconds,
            "buckets": self.buckets,
            "predicted_comm_seconds": self.predicted_comm_seconds,
            "predicted_exposed_seconds": self.predicted_exposed_seconds,
            "predicted_overlap": self.predicted_overlap,
            "predicted_error": self.predicted_error,
            "predicted_wire_bytes": self.predicted_wire_bytes,
            "feasible": self.feasible,
            "solver": self.solver,
            "layers": [layer.to_dict() for layer in self.layers],
        }


def _seconds_text(seconds: float) -> str:
    return f"{seconds:.3g} s"


def _bytes_text(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} B"


@dataclass(slots=True)
class _Pending:
    """A layer left to the optimizer, with its options and any back-off note."""

    index: int
    layer: LayerProfile
    options: list[LayerOption]
    rel_errors: dict[str, float]
    note: str
    true_options: dict[str, LayerOption] = field(default_factory=dict)
    """Undiscounted options by key (the optimizer sees the current one discounted)."""


class PolicyEngine:
    """Decides every layer's compressor from the rules, the cost model and the profiles."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Engine settings."""

        resolution: int = 2000
        """Budget units of the optimizer's dynamic program."""
        bucket_cap_bytes: int = 25 * 1024 * 1024
        """DDP's bucket size (its default bucket_cap_mb=25), to count buckets when unknown."""
        priors: ErrorPriors = field(default_factory=ErrorPriors)
        """Relative errors used until the profiler measures them."""
        switch_margin: float = 0.15
        """Hysteresis: a layer's current compressor looks this much cheaper and more accurate
        to the optimizer, so noisy measurements do not flap the plan (every switch discards
        warm-start state)."""

    def __init__(
        self,
        rules: PolicyRules,
        cost_model: CostModelProtocol,
        *,
        target_overlap: float,
        config: Config | None = None,
    ) -> None:
        if not isinstance(target_overlap, (int, float)) or not 0.0 <= target_overlap <= 1.0:
            raise ValueError(f"target_overlap must be in [0, 1], got {target_overlap!r}")
        self.rules = rules
        self.cost_model = cost_model
        self.target_overlap = float(target_overlap)
        self.config = config or PolicyEngine.Config()
        if self.config.bucket_cap_bytes < 1:
            raise ValueError("bucket_cap_bytes must be >= 1")
        self._optimizer = BudgetOptimizer(BudgetOptimizer.Config(resolution=self.config.resolution))
        self._candidates: tuple[Compressor, ...] = tuple(
            build_compressor(spec) for spec in rules.candidates
        )

    # ---- public ----------------------------------------------------------------------------

    def decide(
        self,
        layers: list[LayerProfile],
        timing: StepTiming,
        step: int,
        world_size: int,
        backoff: Mapping[str, int] = _NO_BACKOFF,
        pins: Sequence[tuple[str, str]] = (),
        force_none: bool = False,
        current: Mapping[str, str] | None = None,
        hold_reason: str | None = None,
    ) -> PolicyDecision:
        """The plan for the next steps; see the module docstring for the rules and budget.

        Args:
            layers: one profile per parameter, in a fixed order (the decision keeps it).
            timing: recent step timing; ``hideable_seconds`` is H.
            step: current step (warmup compares against it).
            world_size: ranks in the group.
            backoff: guard back-off levels by layer name; a level forbids that many of the
                layer's heaviest candidates (lightest = lowest prior error, 'none' first).
            pins: (glob, spec) pairs tried before the policy's own pins, first match wins.
            force_none: operator override, every layer uncompressed.
            current: each layer's spec in use now; it gets ``Config.switch_margin`` of
                hysteresis in the optimizer.
            hold_reason: set when measurements showed compression not paying here
                (:class:`~autocomp.policy.payoff.PayoffCheck`): the layers the optimizer
                would decide stay uncompressed, with this reason (rule ``no_gain``).
        """
        names = [layer.name for layer in layers]
        if len(set(names)) != len(names):
            raise ValueError("layer names must be unique")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        for name, levels in backoff.items():
            if isinstance(levels, bool) or not isinstance(levels, int) or levels < 0:
                raise ValueError(f"backoff[{name!r}] must be an integer >= 0, got {levels!r}")
        all_pins = (*_runtime_pins(pins), *self.rules.pins)
        bandwidth = self.cost_model.bandwidth_bytes_per_s
        latency = _LatencyCache(self.cost_model, world_size)

        decisions: list[LayerDecision | None] = [None] * len(layers)
        pending: list[_Pending] = []
        for index, layer in enumerate(layers):
            ruled = self._rule(layer, step, world_size, bandwidth, all_pins, force_none)
            if ruled is not None:
                rule, spec, reason = ruled
                decisions[index] = self._fixed(layer, rule, spec, reason, latency)
            else:
                in_use = None if current is None else current.get(layer.name)
                levels = backoff.get(layer.name, 0)
                pending.append(self._pending(index, layer, levels, latency, in_use))

        buckets = self._bucket_count(layers)
        per_bucket_latency = latency.of(Collective.ALL_REDUCE) if world_size > 1 else 0.0
        latency_seconds = buckets * per_bucket_latency
        hideable = timing.hideable_seconds
        target = self.target_overlap
        budget = hideable / target if target > 0 else math.inf
        groups = _Groups.build(layers, timing, hideable)
        latency_by_group = [per_bucket_latency * g.buckets for g in groups.groups]
        fixed_by_group = groups.seconds(decisions, latency_by_group)
        solver = ""
        if pending and hold_reason is not None:
            for item in pending:
                decisions[item.index] = self._none(item, hold_reason)
            pending = []
            solver = "held"
        if pending:
            pending.sort(key=lambda p: (groups.group_of[p.index], p.index))
            counts = [0] * len(groups.groups)
            for item in pending:
                counts[groups.group_of[item.index]] += 1
            solution, relaxed = self._solve(pending, groups, counts, fixed_by_group, budget)
            solver = solution.method + (" (relaxed)" if relaxed else "")
            for item, explained in zip(
                pending, self._explain(pending, solution, relaxed), strict=True
            ):
                decisions[item.index] = explained
            if self._gain_too_small(pending, decisions, groups, fixed_by_group, timing, current):
                solver += ", below min_gain"

        final = tuple(d for d in decisions if d is not None)
        comm = latency_seconds + math.fsum(d.predicted_seconds for d in final)
        exposed = max(0.0, groups.excess(groups.seconds(decisions, latency_by_group)))
        overlap = 1.0 - exposed / comm if comm > 0 else 1.0
        feasible = _meets(exposed, comm, budget, target)
        decision = PolicyDecision(
            step=step,
            policy=self.rules.name,
            layers=final,
            world_size=world_size,
            bandwidth_bytes_per_s=bandwidth,
            target_overlap=target,
            hideable_seconds=hideable,
            budget_seconds=budget,
            latency_seconds=latency_seconds,
            buckets=buckets,
            predicted_comm_seconds=comm,
            predicted_exposed_seconds=exposed,
            predicted_overlap=overlap,
            predicted_error=math.fsum(d.predicted_error for d in final),
            predicted_wire_bytes=sum(d.predicted_wire_bytes for d in final),
            feasible=feasible,
            solver=solver,
        )
        logger.debug(
            "step %d: C=%.4g s, H=%.4g s, overlap %.3f (target %.2f), %d/%d layers compressed",
            step,
            comm,
            hideable,
            overlap,
            target,
            sum(1 for d in final if d.spec != NONE_SPEC),
            len(final),
        )
        return decision

    def lightness_order(self, layer: LayerProfile) -> list[Compressor]:
        """The layer's usable candidates, lightest first: what guard back-off walks along.

        Ordered by the prior relative error on this shape ('none' first), then by more wire
        bytes, then by spec. Priors rather than measurements keep the order stable while the
        profiler only measures the compressors actually in use.
        """
        priors = self.config.priors
        usable = [c for c in self._candidates if self._usable(c, layer)]
        return sorted(
            usable,
            key=lambda c: (
                priors.rel_error(c, layer.shape),
                -c.wire_bytes(layer.shape, layer.dtype),
                c.spec,
            ),
        )

    # ---- rules -----------------------------------------------------------------------------

    def _rule(
        self,
        layer: LayerProfile,
        step: int,
        world_size: int,
        bandwidth: float | None,
        pins: Sequence[Pin],
        force_none: bool,
    ) -> tuple[str, str, str] | None:
        """(rule, spec, reason) when a rule decides the layer, else None."""
        rules = self.rules
        if step < rules.warmup_steps:
            return (
                RULE_WARMUP,
                NONE_SPEC,
                f"warmup: step {step} < warmup_steps {rules.warmup_steps}",
            )
        if force_none:
            return RULE_FORCE_NONE, NONE_SPEC, "operator override: force none"
        pin = next((p for p in pins if p.matches(layer.name)), None)
        if pin is not None:
            return RULE_PIN, pin.compressor, f"pinned by {pin.match}"
        if layer.numel < rules.min_numel:
            return (
                RULE_TOO_SMALL,
                NONE_SPEC,
                f"too small: {layer.numel} elements < min_numel {rules.min_numel}",
            )
        if len(layer.shape) <= 1 and not rules.compress_1d:
            return RULE_ONE_D, NONE_SPEC, "1-D: compress_1d is false"
        if world_size == 1:
            return RULE_SINGLE_RANK, NONE_SPEC, "single rank: nothing to communicate"
        if bandwidth is None:
            return RULE_NO_BANDWIDTH, NONE_SPEC, "no bandwidth measurement yet"
        gbit = bandwidth * 8 / 1e9
        if gbit >= rules.fast_link_gbit:
            return (
                RULE_FAST_LINK,
                NONE_SPEC,
                f"fast link: {gbit:.3g} Gbit/s >= {rules.fast_link_gbit:g}",
            )
        return None

    # ---- costs -----------------------------------------------------------------------------

    def _usable(self, compressor: Compressor, layer: LayerProfile) -> bool:
        """Whether the candidate would actually compress this layer and send fewer bytes."""
        if isinstance(compressor, NoCompression):
            return True
        if isinstance(compressor, PowerSGD) and not compressor.compresses(layer.shape):
            return False
        return compressor.wire_bytes(layer.shape, layer.dtype) < layer.raw_bytes

    def _cost(
        self, compressor: Compressor, layer: LayerProfile, latency: _LatencyCache
    ) -> tuple[float, int]:
        """(seconds on the critical path, wire bytes) of one layer with one compressor."""
        wire = compressor.wire_bytes(layer.shape, layer.dtype)
        collective = compressor.collective
        base = latency.of(collective)
        seconds = max(0.0, latency.comm(collective, wire) - base)
        own_collective = collective is not Collective.ALL_REDUCE or (
            compressor.payload_dtype(layer.dtype) != layer.dtype
        )
        if own_collective:
            seconds += base
        seconds += max(0.0, float(self.cost_model.compress_seconds(compressor, layer.shape)))
        return seconds, wire

    def _rel_error(self, compressor: Compressor, layer: LayerProfile) -> float:
        try:
            measured = {_canonical(spec): value for spec, value in layer.rel_error.items()}
        except (ValueError, TypeError) as err:
            raise ValueError(f"{layer.name}: bad spec in rel_error: {err}") from None
        if compressor.spec in measured:
            return float(measured[compressor.spec])
        priors = self.config.priors
        prior = priors.rel_error(compressor, layer.shape)
        if prior <= 0:
            return prior
        # The priors' order within a family (rank 16 beats rank 4) holds on real gradients,
        # their level does not: under error feedback a layer may be much harder to compress
        # than the synthetic tensors. Without this, an unmeasured option always looks better
        # than the measured one in use, and the plan hops to it, window after window. The
        # same family's measurements say most; failing those, the layer's others do.
        ratios: dict[bool, list[float]] = {True: [], False: []}
        for spec, value in measured.items():
            other = _built(spec)
            reference = priors.rel_error(other, layer.shape)
            if reference > 0 and value > 0:
                ratios[other.name == compressor.name].append(value / reference)
        same_family = bool(ratios[True])
        chosen = ratios[True] or ratios[False]
        if not chosen:
            return prior
        scale = math.exp(math.fsum(math.log(r) for r in chosen) / len(chosen))
        if not same_family:
            # Another family's success says little about this one; its failure says the
            # layer is hard. Only the pessimistic direction crosses families.
            scale = max(1.0, scale)
        # Dropping the whole gradient is a relative error of 1: a biased compressor's
        # calibrated prior never claims worse (unbiased ones may start above 1).
        return min(prior * scale, max(1.0, prior))

    def _fixed(
        self, layer: LayerProfile, rule: str, spec: str, reason: str, latency: _LatencyCache
    ) -> LayerDecision:
        compressor = build_compressor(spec)
        if latency.world_size > 1:
            seconds, wire = self._cost(compressor, layer, latency)
        else:
            seconds, wire = 0.0, compressor.wire_bytes(layer.shape, layer.dtype)
        error = self._rel_error(compressor, layer) ** 2 * layer.grad_norm**2
        return LayerDecision(
            name=layer.name,
            spec=compressor.spec,
            reason=reason,
            rule=rule,
            predicted_seconds=seconds,
            predicted_wire_bytes=wire,
            predicted_error=error,
        )

    def _pending(
        self,
        index: int,
        layer: LayerProfile,
        levels: int,
        latency: _LatencyCache,
        in_use: str | None = None,
    ) -> _Pending:
        ordered = self.lightness_order(layer)
        note = ""
        if levels > 0:
            keep = max(1, len(ordered) - levels)
            dropped = ordered[keep:]
            ordered = ordered[:keep]
            excluded = ", ".join(c.spec for c in dropped) or "nothing left to exclude"
            note = f"guard back-off by {levels} (excludes {excluded}); "
        options = []
        rel_errors = {}
        for compressor in ordered:
            seconds, wire = self._cost(compressor, layer, latency)
            rel = self._rel_error(compressor, layer)
            rel_errors[compressor.spec] = rel
            error = rel**2 * layer.grad_norm**2
            options.append(LayerOption(compressor.spec, seconds, error, wire))
        true_options = {option.key: option for option in options}
        keep = 1.0 - self.config.switch_margin
        if in_use is not None and len(options) > 1:
            options = [
                LayerOption(o.key, o.seconds * keep, o.error * keep, o.wire_bytes)
                if o.key == in_use
                else o
                for o in options
            ]
        return _Pending(index, layer, options, rel_errors, note, true_options)

    def _bucket_count(self, layers: Sequence[LayerProfile]) -> int:
        if not layers:
            return 0
        if all(layer.bucket is not None for layer in layers):
            return len({layer.bucket for layer in layers})
        total = sum(layer.raw_bytes for layer in layers)
        return max(1, math.ceil(total / self.config.bucket_cap_bytes))

    # ---- reasons ---------------------------------------------------------------------------

    def _gain_too_small(
        self,
        pending: Sequence[_Pending],
        decisions: list[LayerDecision | None],
        groups: _Groups,
        fixed_by_group: Sequence[float],
        timing: StepTiming,
        current: Mapping[str, str] | None,
    ) -> bool:
        """Send the optimizer's layers uncompressed when compressing buys less than
        ``min_gain`` of the step; True if it did.

        The step's predicted cost of communication is the exposed time plus the compression
        work (which runs on the backward's thread, hidden from nothing). A plan that trims
        that by a few percent of the step trades accuracy for a gain step-time noise hides;
        on links where the uncompressed exposure is small, that is every plan. A plan in use
        keeps its place down to ``1 - switch_margin`` of the threshold (no flapping).
        """
        min_gain = self.rules.min_gain
        if min_gain <= 0 or timing.step_seconds <= 0:
            return False
        compressed = [
            item
            for item in pending
            if decisions[item.index].spec != NONE_SPEC  # type: ignore[union-attr]
        ]
        if not compressed or any(NONE_SPEC not in item.true_options for item in pending):
            return False
        exposed = max(0.0, groups.excess(groups.seconds(decisions, fixed_by_group, pending)))
        none_by_group = list(fixed_by_group)
        for item in pending:
            none_by_group[groups.group_of[item.index]] += item.true_options[NONE_SPEC].seconds
        exposed_none = max(0.0, groups.excess(none_by_group))
        work = math.fsum(
            max(0.0, float(self.cost_model.compress_seconds(_built(d.spec), item.layer.shape)))
            for item in compressed
            if (d := decisions[item.index]) is not None
        )
        gain = (exposed_none - exposed - work) / timing.step_seconds
        in_use = current is not None and any(
            current.get(item.layer.name, NONE_SPEC) != NONE_SPEC for item in pending
        )
        threshold = min_gain * (1.0 - self.config.switch_margin if in_use else 1.0)
        if gain >= threshold:
            return False
        reason = (
            f"compression does not pay: the best plan ({len(compressed)} layers compressed) "
            f"would cut the step by {gain:.1%} (exposed {_seconds_text(exposed_none)} -> "
            f"{_seconds_text(exposed)}, compression work {_seconds_text(work)}), under "
            f"min_gain {min_gain:.0%}"
        )
        for item in pending:
            decisions[item.index] = self._none(item, reason)
        return True

    @staticmethod
    def _none(item: _Pending, reason: str) -> LayerDecision:
        """An optimizer layer left uncompressed because compression does not pay."""
        option = item.true_options[NONE_SPEC]
        return LayerDecision(
            name=item.layer.name,
            spec=NONE_SPEC,
            reason=item.note + reason,
            rule=RULE_NO_GAIN,
            predicted_seconds=option.seconds,
            predicted_wire_bytes=option.wire_bytes,
            predicted_error=option.error,
        )

    def _solve(
        self,
        pending: Sequence[_Pending],
        groups: _Groups,
        counts: Sequence[int],
        fixed_by_group: Sequence[float],
        budget: float,
    ) -> tuple[BudgetSolution, bool]:
        """The optimizer's plan for the pending layers (grouped, last-ready group first), and
        whether the target was out of reach.

        The target ``E <= (1 - t) C`` with ``E = max_g (S_g - H_g)`` (``S_g``: the time of
        group g and the groups ready after it) is a cap on each running total ``S_g <= H_g +
        (1 - t) C``; for the first-ready group it is exactly ``C <= H / t``. The others'
        right-hand side depends on the plan's own C, so they are solved for a lower bound of
        it, the fastest plan's C (a plan meeting those caps meets the target), then once more
        for the first plan's C, kept if it meets the target at its own C with less error.

        When even the fastest options miss the target, the allowed exposure grows to the least
        achievable plus ``time_tolerance`` of the fastest plan's time, and the least-error plan
        within that is taken: as close to the target as the link allows, without giving up
        accuracy for gains smaller than the predictions can resolve.
        """
        target = self.target_overlap
        true_layers = [[item.true_options[o.key] for o in item.options] for item in pending]
        fastest_by_group = list(fixed_by_group)
        for item, options in zip(pending, true_layers, strict=True):
            fastest_by_group[groups.group_of[item.index]] += min(o.seconds for o in options)
        fastest_total = math.fsum(fastest_by_group)
        fastest_exposed = max(0.0, groups.excess(fastest_by_group))
        relaxed = not _meets(fastest_exposed, fastest_total, budget, target)
        if relaxed:
            allowed = fastest_exposed + self._optimizer.config.time_tolerance * fastest_total
            caps, total = self._caps(groups, counts, fixed_by_group, allowed, math.inf, allowed)
            return self._solve_true(pending, true_layers, total, caps), True
        slack = (1.0 - target) * fastest_total
        caps, total = self._caps(groups, counts, fixed_by_group, slack, budget, math.inf)
        solution = self._solve_true(pending, true_layers, total, caps)
        if len(groups.groups) > 1 and target < 1.0:
            first = self._group_seconds(pending, groups, fixed_by_group, solution)
            slack = (1.0 - target) * math.fsum(first)
            caps, total = self._caps(groups, counts, fixed_by_group, slack, budget, math.inf)
            again = self._solve_true(pending, true_layers, total, caps)
            seconds = self._group_seconds(pending, groups, fixed_by_group, again)
            exposed = max(0.0, groups.excess(seconds))
            if again.total_error < solution.total_error and _meets(
                exposed, math.fsum(seconds), budget, target
            ):
                solution = again
        return solution, False

    def _solve_true(
        self,
        pending: Sequence[_Pending],
        true_layers: Sequence[Sequence[LayerOption]],
        total: float,
        caps: Sequence[tuple[int, float]],
    ) -> BudgetSolution:
        """Solve with the hysteresis discount; again without it if only the discount made
        the plan fit (a layer keeps its compressor, never at the price of the target)."""
        solution = self._optimizer.solve([p.options for p in pending], total, caps)
        chosen = [
            [o.key for o in item.options].index(c.option.key)
            for item, c in zip(pending, solution.choices, strict=True)
        ]
        if (
            solution.feasible
            and cap_excess(true_layers, chosen, [*caps, (len(pending), total)]) > 0
        ):
            solution = self._optimizer.solve(true_layers, total, caps)
        return solution

    @staticmethod
    def _caps(
        groups: _Groups,
        counts: Sequence[int],
        fixed_by_group: Sequence[float],
        slack: float,
        budget: float,
        first_slack: float,
    ) -> tuple[list[tuple[int, float]], float]:
        """Running-total caps of the pending layers, and the cap of their total."""
        caps: dict[int, float] = {}
        done = 0
        fixed_prefix = 0.0
        last = len(groups.groups) - 1
        for g, group in enumerate(groups.groups):
            done += counts[g]
            fixed_prefix += fixed_by_group[g]
            if g < last:
                cap = group.hideable + slack - fixed_prefix
            else:
                cap = min(budget, group.hideable + first_slack) - fixed_prefix
            if done > 0:
                caps[done] = min(cap, caps.get(done, math.inf))
        total = caps.pop(done)
        return sorted(caps.items()), total

    @staticmethod
    def _group_seconds(
        pending: Sequence[_Pending],
        groups: _Groups,
        fixed_by_group: Sequence[float],
        solution: BudgetSolution,
    ) -> list[float]:
        """Per group: fixed time plus the chosen options' true seconds."""
        seconds = list(fixed_by_group)
        for item, choice in zip(pending, solution.choices, strict=True):
            option = item.true_options.get(choice.option.key, choice.option)
            seconds[groups.group_of[item.index]] += option.seconds
        return seconds

    def _explain(
        self, pending: Sequence[_Pending], solution: BudgetSolution, relaxed: bool = False
    ) -> list[LayerDecision]:
        infeasible = solution.method == METHOD_MIN_TIME
        out = []
        for item, choice in zip(pending, solution.choices, strict=True):
            # Report true predictions, not the hysteresis-discounted ones the optimizer saw.
            chosen = item.true_options.get(choice.option.key, choice.option)
            if infeasible:
                head = "infeasible budget, fastest option"
            elif relaxed:
                head = "target out of reach, least-error plan near the least exposure"
            else:
                head = "knapsack"
            reason = (
                f"{item.note}{head}: {chosen.key} predicts {_seconds_text(chosen.seconds)}, "
                f"{_bytes_text(chosen.wire_bytes)}, rel. error {item.rel_errors[chosen.key]:.3g}"
            )
            runner = choice.runner_up
            if runner is not None:
                runner = item.true_options.get(runner.key, runner)
            if runner is None:
                reason += "; no other candidate"
            else:
                reason += (
                    f"; runner-up {runner.key} {_seconds_text(runner.seconds)}, "
                    f"rel. error {item.rel_errors[runner.key]:.3g}"
                )
            out.append(
                LayerDecision(
                    name=item.layer.name,
                    spec=chosen.key,
                    reason=reason,
                    rule=RULE_INFEASIBLE if infeasible or relaxed else RULE_KNAPSACK,
                    predicted_seconds=chosen.seconds,
                    predicted_wire_bytes=chosen.wire_bytes,
                    predicted_error=chosen.error,
                    runner_up=None if runner is None else runner.key,
                    runner_up_seconds=None if runner is None else runner.seconds,
                    runner_up_error=None if runner is None else runner.error,
                )
            )
        return out


def _runtime_pins(pins: Sequence[tuple[str, str]]) -> list[Pin]:
    out = []
    for index, item in enumerate(pins):
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"pins[{index}] must be a (glob, spec) pair, got {item!r}")
        match, spec = item
        if not isinstance(match, str) or not match:
            raise ValueError(f"pins[{index}]: glob must be a non-empty string, got {match!r}")
        try:
            canonical = build_compressor(spec).spec
        except (ValueError, TypeError) as err:
            raise ValueError(f"pins[{index}] ({match!r}): {err}") from None
        out.append(Pin(match, canonical))
    return out


class _LatencyCache:
    """Per-decision cache of the cost model's latency (zero-byte time) by collective."""

    def __init__(self, cost_model: CostModelProtocol, world_size: int) -> None:
        self.cost_model = cost_model
        self.world_size = world_size
        self._latency: dict[Collective, float] = {}

    def comm(self, collective: Collective, payload_bytes: int) -> float:
        return float(self.cost_model.comm_seconds(collective, payload_bytes, self.world_size))

    def of(self, collective: Collective) -> float:
        if collective not in self._latency:
            self._latency[collective] = max(0.0, self.comm(collective, 0))
        return self._latency[collective]


@dataclass(frozen=True, slots=True)
class _Group:
    """Layers whose communication can start at the same time (one or more DDP buckets)."""

    hideable: float
    """Backward compute left once these layers' bucket is ready."""
    buckets: int
    """DDP buckets in the group (each costs one all-reduce latency)."""


@dataclass(frozen=True, slots=True)
class _Groups:
    """Layers grouped by bucket, in reverse ready order: the last bucket DDP hands over first.

    The link serves buckets in ready order, so everything from bucket b on has to fit behind
    the backward left once b is ready; the exposed time is the largest shortfall over b.
    """

    groups: tuple[_Group, ...]
    group_of: tuple[int, ...]
    """Group index of every layer, in the order given to ``decide``."""

    @staticmethod
    def build(layers: Sequence[LayerProfile], timing: StepTiming, hideable: float) -> _Groups:
        by_bucket = timing.bucket_hideable_seconds
        known = bool(layers) and all(
            layer.bucket is not None and layer.bucket in by_bucket for layer in layers
        )
        if not known:
            # No per-bucket timeline: one group, everything ready when the first bucket is.
            count = len({layer.bucket for layer in layers}) if layers else 0
            if any(layer.bucket is None for layer in layers):
                count = 0  # the engine estimates bucket latency from sizes then
            return _Groups((_Group(hideable, count),), (0,) * len(layers))
        # The first bucket ready has the whole H by definition; buckets ready together (equal
        # measured H, rounding aside) share one group.
        used = sorted({layer.bucket for layer in layers}, key=lambda b: (by_bucket[b], b))
        values = [min(by_bucket[b], hideable) for b in used]
        values[-1] = hideable
        groups: list[_Group] = []
        index_of: dict[int, int] = {}
        for bucket, value in zip(used, values, strict=True):
            if groups and math.isclose(groups[-1].hideable, value, rel_tol=1e-9, abs_tol=1e-9):
                groups[-1] = _Group(groups[-1].hideable, groups[-1].buckets + 1)
            else:
                groups.append(_Group(value, 1))
            index_of[bucket] = len(groups) - 1
        return _Groups(tuple(groups), tuple(index_of[layer.bucket] for layer in layers))  # type: ignore[index]

    def seconds(
        self,
        decisions: Sequence[LayerDecision | None],
        base: Sequence[float],
        only: Sequence[_Pending] | None = None,
    ) -> list[float]:
        """Per group: ``base`` plus the decided layers' predicted seconds (all decided
        layers, or those of ``only``)."""
        out = list(base)
        indices = range(len(decisions)) if only is None else [item.index for item in only]
        for index in indices:
            decided = decisions[index]
            if decided is not None:
                out[self.group_of[index]] += decided.predicted_seconds
        return out

    def excess(self, seconds_by_group: Sequence[float]) -> float:
        """Largest shortfall over groups of (their time and the later-ready ones') against
        the backward left once they are ready: the exposed time when positive."""
        worst = -math.inf
        running = 0.0
        for group, seconds in zip(self.groups, seconds_by_group, strict=True):
            running += seconds
            worst = max(worst, running - group.hideable)
        return worst


def _meets(exposed: float, comm: float, budget: float, target: float) -> bool:
    """Whether a plan's predicted exposure and communication meet the overlap target."""
    tolerance = 1e-9
    return exposed <= (1.0 - target) * comm * (1 + tolerance) + 1e-12 and comm <= budget * (
        1 + tolerance
    )
