"""What the policy engine takes in and gives out: layer profiles, step timing, decisions."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from autocomp.compressors import Collective, Compressor

__all__ = [
    "NONE_SPEC",
    "OPTIMIZER_RULES",
    "RULE_DWELL",
    "RULE_FAST_LINK",
    "RULE_FORCE_NONE",
    "RULE_KNAPSACK",
    "RULE_NO_BANDWIDTH",
    "RULE_NO_GAIN",
    "RULE_ONE_D",
    "RULE_PIN",
    "RULE_RIDE_ALONG",
    "RULE_SINGLE_RANK",
    "RULE_SLACK",
    "RULE_TOO_SMALL",
    "RULE_WARMUP",
    "CostModelProtocol",
    "LayerDecision",
    "LayerProfile",
    "PolicyDecision",
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
"""The plan search chose, and the plan meets the overlap target."""
RULE_SLACK = "slack"
"""The plan search chose the least error within the time slack of the fastest plan."""
RULE_NO_GAIN = "no_gain"
RULE_DWELL = "dwell"
"""Kept: the layer changed compressor fewer than ``dwell_windows`` windows ago."""
RULE_RIDE_ALONG = "ride_along"
"""A layer a rule held at 'none' takes its bucket's lossless cast (policy/ride_along.py)."""
OPTIMIZER_RULES = (RULE_KNAPSACK, RULE_SLACK, RULE_DWELL)
"""Rules under which the engine, not a fixed rule, chose the compressor."""


@runtime_checkable
class CostModelProtocol(Protocol):
    """What the engine needs from a cost model (the measured link and compute costs)."""

    def comm_seconds(self, collective: Collective, payload_bytes: int, world_size: int) -> float:
        """Predicted time of one collective carrying ``payload_bytes`` per rank."""
        ...

    def compress_seconds(
        self, compressor: Compressor, shape: torch.Size, nonzero_share: float = 1.0
    ) -> float:
        """Predicted compression work on the critical path for one tensor of ``shape`` whose
        gradient has ``nonzero_share`` of its elements nonzero (top-k's selection reads it)."""
        ...

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        """Measured link bandwidth, or None before any measurement."""
        ...

    def contention_rate(self) -> float:
        """Backward seconds lost per second the link is busy beside it (0: none measured)."""
        ...

    def half_sum_seconds_per_element(self, dtype: torch.dtype) -> float:
        """What an all-reduce of ``dtype`` costs per element beyond its bytes (0: nothing)."""
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
    """Recent L2 norm of the (averaged) gradient; weighs the layer's error under
    ``error_weight = "grad_norm"`` and ``"grad_l1"``."""
    rel_error: Mapping[str, float] = field(default_factory=dict)
    """Measured ||C(g) - g|| / ||g|| by spec (smoothed over windows by the caller); missing
    specs fall back to :class:`~autocomp.policy.priors.ErrorPriors`."""
    grad_l1: float | None = None
    """Recent L1 norm of the gradient (measured on sampled steps; None before any, when
    ``error_weight = "grad_l1"`` estimates it from ``grad_norm``)."""
    nonzero_share: float = 1.0
    """Fraction of the gradient's elements that are nonzero (measured on sampled steps; 1
    before any). Top-k at ratio r of a gradient with nonzero share d acts as top-(r/d) of
    its nonzeros: an embedding table's row-sparse gradient loses nothing to top-1%."""
    bucket: int | None = None
    """DDP bucket index when known (counts the per-bucket latency exactly)."""
    sparse_bytes: int | None = None
    """A sparse gradient (an embedding with ``sparse=True``, pinned to ``none``): the bytes of
    rows and indices one rank sends per step, which a sparse all-reduce gathers from every
    rank. None for a dense gradient."""

    def __post_init__(self) -> None:
        if not isinstance(self.shape, torch.Size):
            object.__setattr__(self, "shape", torch.Size(self.shape))
        if not math.isfinite(self.grad_norm) or self.grad_norm < 0:
            raise ValueError(f"{self.name}: grad_norm must be finite and >= 0")
        if self.grad_l1 is not None and (not math.isfinite(self.grad_l1) or self.grad_l1 < 0):
            raise ValueError(f"{self.name}: grad_l1 must be finite and >= 0")
        if not 0.0 <= self.nonzero_share <= 1.0:
            raise ValueError(f"{self.name}: nonzero_share must be in [0, 1]")
        if self.sparse_bytes is not None and self.sparse_bytes < 0:
            raise ValueError(f"{self.name}: sparse_bytes must be >= 0")
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
    compute_seconds: float | None = None
    """The compute-only step (``exposure.compute_seconds`` of the measured step); what a plan's
    added time is added to. None: ``step_seconds`` stands in (an upper bound, which widens the
    time slack in favour of accuracy)."""
    sync_seconds: float = 0.0
    """Per-step time the exposure model leaves out (the ranks' skew at the first collective,
    thread hand-offs), measured (:class:`autocomp.step_gap.StepGap`): added to every plan's
    predicted step."""

    def __post_init__(self) -> None:
        for name in ("backward_seconds", "hideable_seconds", "step_seconds", "sync_seconds"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"StepTiming.{name} must be finite and >= 0, got {value!r}")
        compute = self.compute_seconds
        if compute is not None and (not math.isfinite(compute) or compute < 0):
            raise ValueError(f"StepTiming.compute_seconds must be finite and >= 0, got {compute}")
        for index, value in self.bucket_hideable_seconds.items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"StepTiming.bucket_hideable_seconds[{index}] must be finite and >= 0, "
                    f"got {value!r}"
                )

    @property
    def compute(self) -> float:
        """The compute-only step used for predictions."""
        return self.step_seconds if self.compute_seconds is None else self.compute_seconds

    @property
    def base(self) -> float:
        """What every plan's predicted step starts from: the compute-only step plus the
        measured per-step gap; a plan's added time comes on top."""
        return self.compute + self.sync_seconds


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
    no_bandwidth, fast_link, knapsack, slack, no_gain, dwell or ride_along."""
    predicted_seconds: float
    """Time this layer adds to C (communication bandwidth term, extra latency, compression)."""
    predicted_wire_bytes: int
    """Bytes this rank sends for this layer per step."""
    predicted_error: float
    """Predicted squared error rel_error^2 * weight (the ``error_weight`` rule)."""
    runner_up: str | None = None
    """Best alternative spec (optimizer layers only)."""
    runner_up_seconds: float | None = None
    """The runner-up's predicted seconds for this layer."""
    runner_up_error: float | None = None
    """The runner-up's predicted squared error for this layer."""
    predicted_work_seconds: float = 0.0
    """The compression work within ``predicted_seconds`` (on the backward's thread)."""
    predicted_rounds_seconds: tuple[float, float] = (0.0, 0.0)
    """Of the communication, a two-round compressor's first and second round."""
    predicted_late_work_seconds: tuple[float, float] = (0.0, 0.0)
    """Of the work, what runs after a collective: the final round's payload (after the first
    round) and the decode (after the last)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "spec": self.spec,
            "reason": self.reason,
            "rule": self.rule,
            "predicted_seconds": self.predicted_seconds,
            "predicted_work_seconds": self.predicted_work_seconds,
            "predicted_rounds_seconds": list(self.predicted_rounds_seconds),
            "predicted_late_work_seconds": list(self.predicted_late_work_seconds),
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
    """H / t: the most C may be for the overlap target to be met (inf when t == 0)."""
    latency_seconds: float
    """Fixed per-step latency term included in C (one all-reduce latency per bucket)."""
    buckets: int
    """Buckets that term counts."""
    predicted_comm_seconds: float
    """C: latency term plus every layer's predicted seconds (compression work included)."""
    predicted_exposed_seconds: float
    """E: communication still running when the backward (with the compression work on its
    thread) ends, from :mod:`autocomp.exposure`."""
    predicted_overlap: float
    """1 - exposed / C (1.0 when C == 0)."""
    predicted_error: float
    """Sum of the layers' predicted squared errors."""
    predicted_wire_bytes: int
    """Bytes this rank sends per step, all layers."""
    feasible: bool
    """Whether the prediction meets the overlap target."""
    solver: str
    """How the optimizer layers were solved ('' when every layer was rule-decided)."""
    compute_seconds: float = 0.0
    """The compute-only step the prediction starts from."""
    sync_seconds: float = 0.0
    """The measured per-step gap added to every plan (``StepTiming.sync_seconds``)."""
    predicted_step_seconds: float = 0.0
    """Compute-only step plus the gap plus the plan's added time (work plus exposed)."""
    fastest_step_seconds: float | None = None
    """T*: the predicted step of the fastest plan the optimizer found (None without one)."""
    time_slack: float = 0.0
    """Plans within (1 + time_slack) x T* counted as equally fast; the least error won."""
    required_gain: float = 0.0
    """The step-time gain the optimizer's compressed layers had to buy, against all of them
    uncompressed: ``error_cost`` x their mean squared relative error (0 when none is
    compressed). The payoff check holds measured windows to it too."""
    uncompressed_step_seconds: float | None = None
    """Predicted step with every optimizer layer uncompressed (None without such layers)."""
    contention_rate: float = 0.0
    """Backward seconds lost per second the link is busy beside it (measured at the opening;
    ``exposure.simulate``)."""
    predicted_contention_seconds: float = 0.0
    """Of the predicted step: backward time this plan's transfers take (part of it)."""
    locks_outvoted: bool = False
    """The plan without the caller's dwell locks learns ``dwell_max_loss`` more per second
    than the locked one (whether or not the locks were released)."""

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
            "compute_seconds": self.compute_seconds,
            "sync_seconds": self.sync_seconds,
            "predicted_step_seconds": self.predicted_step_seconds,
            "fastest_step_seconds": _finite_or_none(self.fastest_step_seconds),
            "time_slack": self.time_slack,
            "required_gain": self.required_gain,
            "uncompressed_step_seconds": self.uncompressed_step_seconds,
            "contention_rate": self.contention_rate,
            "predicted_contention_seconds": self.predicted_contention_seconds,
            "locks_outvoted": self.locks_outvoted,
            "layers": [layer.to_dict() for layer in self.layers],
        }
