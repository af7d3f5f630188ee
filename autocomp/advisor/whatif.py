"""The what-if model: step time on a link you do not have, from a profile taken on one you do.

Inputs are the profile (per-layer gradient sizes, the bucket-ready timeline of the backward,
the compute-only step time, compression costs measured on the profiling machine) and a
scenario: bandwidth, per-hop latency and world size. For each option (uncompressed, fp16,
PowerSGD ranks 1/2/4, top-k 1% and 0.1%, and the adaptive per-layer plan) it predicts:

1. **Per bucket, the communication time** with the alpha-beta model of
   :mod:`autocomp.link_model`: ``hops * alpha + link_bytes / bandwidth``, where a ring
   all-reduce of P bytes per rank has ``2(N-1)`` hops and ``2(N-1)/N * P`` link bytes and an
   all-gather ``N-1`` hops and ``(N-1) * P``. A bucket issues one all-reduce per payload dtype
   plus one all-gather when some of its layers need one, as :mod:`autocomp.hook` does.
2. **Compression work**: per layer, the measured sending-side work plus the decode of one
   payload per received payload (1 for all-reduce, N for all-gather). Where the profile has no
   measurement (the budget ran out), the cost model warm-started from the profile predicts it.
3. **The pipeline** (:func:`simulate_pipeline`, the one exposure model of
   :mod:`autocomp.exposure` that the policy engine and the profiler use too): bucket b becomes
   ready at its measured time, delayed by the compression work of the buckets before it (the
   hook runs on the backward's thread); its collectives start when it is ready *and* bucket
   b-1's have finished. PowerSGD's final round waits for its first (the next bucket's hook
   call computes and launches it), and the last bucket's final-round work and decode follow
   its collectives, as the engine predicts them. Exposed time is what runs past the end of
   the backward.
4. **Step time** = compute-only step (measured) + compression work + exposed communication;
   **scaling efficiency** = compute-only step / predicted step (1.0 = perfect weak scaling).

The adaptive plan is what the adaptive controller would choose: the default policy with
warm-up 0, a :class:`~autocomp.cost_model.CostModel` warm-started from the profile's
measurements, and a :class:`~autocomp.link_model.LinkEstimate` of the scenario, fed to
:class:`~autocomp.policy.engine.PolicyEngine`.

Uniform options compress every parameter with at least two dimensions and at least the
policy's ``min_numel`` elements; biases, norm scales and tiny tensors stay uncompressed, as
anyone deploying them would configure it.

The verdict (compress or not, and why) is worked out from an :class:`Evaluation` in
:mod:`autocomp.advisor.verdict`; :meth:`WhatIfModel.verdict` is its entry point.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autocomp.advisor.costs import eligible
from autocomp.advisor.profile import LayerInfo, ModelProfile, Profile
from autocomp.advisor.units import format_bandwidth, format_seconds
from autocomp.advisor.verdict import DO_NOT_COMPRESS_COSTLY as DO_NOT_COMPRESS_COSTLY
from autocomp.advisor.verdict import DO_NOT_COMPRESS_HIDDEN as DO_NOT_COMPRESS_HIDDEN
from autocomp.advisor.verdict import Verdict, judge
from autocomp.attach import sparse_pins
from autocomp.compressors import (
    Collective,
    Compressor,
    NoCompression,
    build_compressor,
    effective_compressor,
)
from autocomp.cost_model import HALF_DTYPES_BY_NAME, CostModel
from autocomp.cost_prior import CostSample, payload_count
from autocomp.exposure import Group, Timeline, simulate
from autocomp.link_model import LinkEstimate, link_bytes
from autocomp.policy.engine import (
    ErrorPriors,
    LayerProfile,
    PolicyDecision,
    PolicyEngine,
    StepTiming,
)
from autocomp.policy.priors import built
from autocomp.policy.rules import PolicyRules, error_weight, load_policy

logger = logging.getLogger(__name__)

__all__ = [
    "ADAPTIVE",
    "OPTIONS",
    "TCP_ETHERNET_EFFICIENCY",
    "Evaluation",
    "Option",
    "OptionResult",
    "Scenario",
    "Verdict",
    "WhatIfModel",
    "collective_seconds",
    "simulate_pipeline",
]

ADAPTIVE = "adaptive"
"""Key of the adaptive per-layer plan among the options."""
TCP_ETHERNET_EFFICIENCY = 1448 / 1514
"""Payload share of a 1500-byte Ethernet frame carrying TCP/IPv4 with timestamps (1448 of
1514 bytes): a link of line rate R moves collective payload at most at this share of R."""


@dataclass(frozen=True, slots=True)
class Option:
    """One way to send the gradients that the advisor compares."""

    key: str
    """Short identifier (JSON key, plot legend)."""
    label: str
    """Human name."""
    spec: str | None
    """Compressor spec applied uniformly; None for the adaptive per-layer plan."""


OPTIONS: tuple[Option, ...] = (
    Option("none", "uncompressed", "none"),
    Option("fp16", "fp16", "fp16:ef=false"),
    Option("powersgd-r1", "PowerSGD rank 1", "powersgd:rank=1"),
    Option("powersgd-r2", "PowerSGD rank 2", "powersgd:rank=2"),
    Option("powersgd-r4", "PowerSGD rank 4", "powersgd:rank=4"),
    Option("topk-1%", "top-k 1%", "topk:ratio=0.01"),
    Option("topk-0.1%", "top-k 0.1%", "topk:ratio=0.001"),
    Option(ADAPTIVE, "adaptive plan", None),
)
"""The options of every evaluation, 'none' first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """The link and job size to predict for."""

    bandwidth_bytes_per_s: float
    """What one rank can push through its link."""
    latency_s: float
    """Per-hop latency (alpha)."""
    world_size: int
    """Ranks in the job."""
    payload_efficiency: float = 1.0
    """Share of the bandwidth that carries collective payload (protocol headers take the
    rest); 1 when the bandwidth is a measured goodput."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0):
            raise ValueError(f"bandwidth must be > 0, got {self.bandwidth_bytes_per_s!r}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"latency must be >= 0, got {self.latency_s!r}")
        if isinstance(self.world_size, bool) or self.world_size < 2:
            raise ValueError(f"world size must be >= 2, got {self.world_size!r}")
        if not (math.isfinite(self.payload_efficiency) and 0 < self.payload_efficiency <= 1):
            raise ValueError(
                f"payload efficiency must be in (0, 1], got {self.payload_efficiency!r}"
            )

    @property
    def link(self) -> LinkEstimate:
        return LinkEstimate(
            latency_s=self.latency_s,
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s * self.payload_efficiency,
            samples=1,
            rel_residual=0.0,
        )

    def describe(self) -> str:
        return (
            f"{format_bandwidth(self.bandwidth_bytes_per_s)}, "
            f"{format_seconds(self.latency_s)}/hop, {self.world_size} ranks"
            + (
                f", {self.payload_efficiency:.1%} of it payload"
                if self.payload_efficiency < 1
                else ""
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "bandwidth_gbit_s": self.bandwidth_bytes_per_s * 8 / 1e9,
            "latency_s": self.latency_s,
            "world_size": self.world_size,
            "payload_efficiency": self.payload_efficiency,
        }


def collective_seconds(
    collective: Collective, payload_bytes: int, world_size: int, link: LinkEstimate
) -> float:
    """Ring time of one collective: ``hops * alpha + link_bytes / bandwidth`` (link_model)."""
    return link.seconds(collective, payload_bytes, world_size)


# ---- the pipeline ----------------------------------------------------------------------------


def simulate_pipeline(
    ready: Sequence[float],
    comm: Sequence[float],
    local: Sequence[float] | None = None,
    decode: Sequence[float] | None = None,
    contention: float = 0.0,
    rounds: Sequence[tuple[float, float]] | None = None,
    final_work: Sequence[float] | None = None,
) -> Timeline:
    """The exposure model (:func:`autocomp.exposure.simulate`) on buckets given by their ready
    times (seconds after the end of the forward, non-decreasing), collective times, the hook's
    sending-side work (on the backward's thread), the decode that follows each bucket's
    collectives, the two-round traffic within ``comm`` (first, second round) and the part of
    ``local`` computed between the rounds; ``contention`` as there (the backward's share lost
    while the link is busy beside it). The engine places the same parts the same way.
    """
    count = len(ready)
    if len(comm) != count:
        raise ValueError("ready and comm must have the same length")
    local = list(local) if local is not None else [0.0] * count
    decode = list(decode) if decode is not None else [0.0] * count
    rounds = list(rounds) if rounds is not None else [(0.0, 0.0)] * count
    final_work = list(final_work) if final_work is not None else [0.0] * count
    if any(len(v) != count for v in (local, decode, rounds, final_work)):
        raise ValueError("local, decode, rounds and final_work must have one entry per bucket")
    if any(b < a for a, b in itertools.pairwise(ready)):
        raise ValueError("ready times must be non-decreasing (buckets in the order they fire)")
    last = ready[-1] if count else 0.0
    return simulate(
        [
            Group(
                hideable_s=last - r,
                comm_s=c,
                work_s=w + d,
                first_round_s=first,
                second_round_s=second,
                final_work_s=min(f, w),
                decode_s=d,
            )
            for r, c, w, d, (first, second), f in zip(
                ready, comm, local, decode, rounds, final_work, strict=True
            )
        ],
        contention,
    )


# ---- results ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class OptionResult:
    """Predicted step of one option in one scenario."""

    key: str
    label: str
    plan: Mapping[str, str]
    """Canonical spec per layer name."""
    compressed_layers: int
    wire_bytes: int
    """Payload bytes one rank hands to collectives per step."""
    link_bytes: float
    """Bytes one rank sends on its link per step (ring factors applied)."""
    comm_s: float
    """Collective time plus decode (all buckets)."""
    compress_s: float
    """Sending-side compression work."""
    exposed_s: float
    step_s: float
    efficiency: float
    """compute-only step / step."""
    speedup: float
    """uncompressed step / this step."""
    overlap: float
    rel_error: float
    """Gradient-norm-weighted relative compression error in use (0 = exact), per step."""
    progress: float = 1.0
    """Share of an uncompressed step's training progress one step delivers, as the engine
    prices errors: 1 - error_cost x the family-weighted mean squared error."""

    def to_dict(self, *, with_plan: bool = False) -> dict[str, Any]:
        out = {
            "key": self.key,
            "label": self.label,
            "compressed_layers": self.compressed_layers,
            "wire_bytes": self.wire_bytes,
            "link_bytes": self.link_bytes,
            "comm_s": self.comm_s,
            "compress_s": self.compress_s,
            "exposed_s": self.exposed_s,
            "step_s": self.step_s,
            "efficiency": self.efficiency,
            "speedup": self.speedup,
            "overlap": self.overlap,
            "rel_error": self.rel_error,
            "progress": self.progress,
        }
        if with_plan:
            out["plan"] = dict(self.plan)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """Every option in one scenario."""

    scenario: Scenario
    compute_step_s: float
    """Measured step without communication (the single-rank step)."""
    results: tuple[OptionResult, ...]
    decision: PolicyDecision | None
    """The policy engine's decision behind the adaptive plan."""

    def result(self, key: str) -> OptionResult:
        for result in self.results:
            if result.key == key:
                return result
        raise KeyError(key)


def _same_setting(a: Compressor, b: Compressor) -> bool:
    """One compressor at one setting, whether or not it keeps a residual."""

    def setting(c: Compressor) -> tuple[str, dict[str, Any]]:
        return c.name, {k: v for k, v in c.config.items() if k != "ef"}

    return setting(a) == setting(b)


# ---- the model -------------------------------------------------------------------------------


class WhatIfModel:
    """Predicts each option's step time for a scenario from one model of a profile."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Policy and verdict thresholds."""

        policy: str | PolicyRules = "default"
        """Policy preset (or rules) behind the adaptive plan; its warm-up is set to 0."""
        target_overlap: float | None = None
        """Overlap target of the adaptive plan (None: the policy's, 0.9 by default)."""
        options: tuple[Option, ...] = OPTIONS
        """Options to compare; the first must be the uncompressed one."""
        compress_gain: float = 0.10
        """'compress' when the chosen option is at least this much faster (10%)."""
        min_gain: float = 0.03
        """'does not pay' below this gain (3%, the noise of step-time measurements)."""
        near_best: float | None = None
        """Options within this of the fastest count as equally fast; least error wins (None:
        the policy's ``time_slack``, the band the engine's search uses)."""
        hidden_fraction: float = 0.05
        """Uncompressed exposed time below this share of the step: 'the link hides it'."""

        def __post_init__(self) -> None:
            if not self.options or self.options[0].spec != "none":
                raise ValueError("the first option must be the uncompressed one ('none')")
            if not 0 <= self.min_gain <= self.compress_gain:
                raise ValueError("need 0 <= min_gain <= compress_gain")
            if self.target_overlap is not None and not 0 < self.target_overlap <= 1:
                raise ValueError(f"target_overlap must be in (0, 1], got {self.target_overlap}")
            if self.near_best is not None and not 0 <= self.near_best < 1:
                raise ValueError(f"near_best must be in [0, 1), got {self.near_best}")

    def __init__(
        self, profile: Profile, model_index: int | None = None, config: Config | None = None
    ) -> None:
        self.profile = profile
        self.model: ModelProfile = profile.model(model_index)
        self.config = config or WhatIfModel.Config()
        rules = load_policy(self.config.policy)
        self.rules = dataclasses.replace(rules, warmup_steps=0)
        self.target_overlap = (
            self.config.target_overlap
            if self.config.target_overlap is not None
            else self.rules.target_overlap
        )
        self.near_best = (
            self.config.near_best if self.config.near_best is not None else self.rules.time_slack
        )
        """The verdict's band of equally fast options."""
        self.layers = {layer.name: layer for layer in self.model.layers}
        self._compressors: dict[str, Compressor] = {}
        self._cost_models: dict[int, CostModel] = {}
        self._priors = ErrorPriors()

    # ---- building blocks -----------------------------------------------------------------

    def compressor(self, spec: str) -> Compressor:
        found = self._compressors.get(spec)
        if found is None:
            found = self._compressors[spec] = build_compressor(spec)
        return found

    def cost_samples(self, world_size: int) -> list[CostSample]:
        """The profile's measurements as cost-model samples for ``world_size`` ranks."""
        out = []
        for item in self.profile.compressors:
            compressor = self.compressor(item.spec)
            seconds = item.local_s + payload_count(compressor, world_size) * item.decode_s
            if seconds > 0:
                out.append(CostSample(item.spec, item.shape, seconds, world_size))
        return out

    def cost_model(self, world_size: int) -> CostModel:
        """A cost model for ``world_size`` ranks, warm-started from the profile (cached).

        It holds the measurements at the what-if world size (all-gather decode scaled to it)
        and at the profiling world size, so a job of either size finds direct evidence.
        """
        model = self._cost_models.get(world_size)
        if model is None:
            model = CostModel(CostModel.Config(world_size=world_size, auto_refit=False))
            samples = self.cost_samples(world_size)
            if self.profile.world_size != world_size and self.profile.world_size >= 1:
                samples += self.cost_samples(self.profile.world_size)
            model.warm_start(samples)
            link = self.profile.link
            if link is not None:
                # Costs of the profiling machine, per byte and per element: they hold on
                # any link the what-if puts it on (the contention rate scales with it).
                model.update_contention(link.contention_seconds_per_byte)
                for name, cost in link.half_sum_seconds_per_element:
                    model.update_half_sum(HALF_DTYPES_BY_NAME[name], cost)
            self._cost_models[world_size] = model
        return model

    def eligible(self, layer: LayerInfo) -> bool:
        """Whether uniform options compress this layer (>= 2-D and >= min_numel elements, and
        a dense gradient: a sparse one is sent as DDP sends it)."""
        return not layer.sparse and eligible(layer.shape, self.rules.min_numel)

    def uniform_plan(self, spec: str) -> dict[str, str]:
        chosen = self.compressor(spec).spec
        none = self.compressor("none").spec
        return {
            name: chosen if self.eligible(layer) else none for name, layer in self.layers.items()
        }

    def rel_error(self, spec: str, layer: LayerInfo) -> float:
        """The error in use for this spec and shape: the measured one-step error (floored by
        the in-use prior where that understates it, :meth:`ErrorPriors.in_use`), else the
        engine's prior. The engine behind the adaptive plan sees the same numbers."""
        compressor = self.compressor(spec)
        if type(compressor) is NoCompression:
            return 0.0
        shape = torch.Size(layer.shape)
        measured = self.profile.measurement(compressor.spec, layer.shape)
        if measured is not None and measured.rel_error is not None:
            return self._priors.in_use(compressor, shape, measured.rel_error, layer.nonzero_share)
        return self._priors.rel_error(compressor, shape, layer.nonzero_share)

    def offered(self, option: Option) -> bool:
        """Whether the policy could run ``option``: the adaptive plan, or a uniform option
        whose compressor (error feedback aside) is among the policy's candidates. The verdict
        recommends only these; the default preset leaves PowerSGD rank 1 out on evidence
        (docs/policy.md, "why no rank 1"), and a faster-looking rank 1 is shown, not advised."""
        if option.spec is None:
            return True
        compressor = self.compressor(option.spec)
        return any(_same_setting(compressor, built(spec)) for spec in self.rules.candidates)

    def layer_profiles(self) -> list[LayerProfile]:
        """The engine's view of the layers: shapes, buckets, norms, measured errors."""
        out = []
        for layer in self.model.layers:
            errors = {}
            shape = torch.Size(layer.shape)
            for item in self.profile.compressors:
                if item.shape == layer.shape and item.rel_error is not None:
                    compressor = self.compressor(item.spec)
                    errors[item.spec] = self._priors.in_use(
                        compressor, shape, item.rel_error, layer.nonzero_share
                    )
            norm = layer.grad_norm if math.isfinite(layer.grad_norm) else 0.0
            out.append(
                LayerProfile(
                    name=layer.name,
                    shape=torch.Size(layer.shape),
                    dtype=layer.torch_dtype,
                    grad_norm=norm,
                    grad_l1=layer.grad_l1,
                    rel_error=errors,
                    nonzero_share=layer.nonzero_share,
                    bucket=layer.bucket,
                    sparse_bytes=layer.sparse_bytes,
                )
            )
        return out

    def _layer_cost(
        self, compressor: Compressor, layer: LayerInfo, world: int, costs: CostModel
    ) -> tuple[float, float, float]:
        """(sending-side seconds, the part of them computed between the rounds, decode
        seconds) of one layer with one compressor; the split by
        :meth:`~autocomp.compressors.Compressor.work_shares` where the profile did not
        measure it."""
        if type(compressor) is NoCompression:
            return 0.0, 0.0, 0.0
        shape = torch.Size(layer.shape)
        final_share, decode_share = compressor.work_shares(shape)
        measured = self.profile.measurement(compressor.spec, layer.shape)
        if measured is not None:
            sending = measured.local_s
            final = sending * final_share / max(1e-12, 1.0 - decode_share)
            return sending, final, measured.decode_s * payload_count(compressor, world)
        total = float(costs.compress_seconds(compressor, shape, layer.nonzero_share))
        return total * (1.0 - decode_share), total * final_share, total * decode_share

    # ---- evaluation ------------------------------------------------------------------------

    def simulate(
        self, plan: Mapping[str, str], scenario: Scenario, costs: CostModel | None = None
    ) -> tuple[Timeline, int, float]:
        """Pipeline of one plan, with the payload and link bytes per rank per step."""
        world = scenario.world_size
        costs = costs or self.cost_model(world)
        link = scenario.link
        ready, comm, local, decode, round_seconds, final_work = [], [], [], [], [], []
        wire_total = 0
        sent_total = 0.0
        for bucket in self.model.buckets:
            payloads: dict[tuple[Collective, torch.dtype | str], int] = defaultdict(int)
            bucket_local = bucket_decode = bucket_final = 0.0
            first_bytes: dict[Collective, int] = defaultdict(int)
            for name in bucket.params:
                layer = self.layers[name]
                # As the hook runs it: a compressor that sends this layer whole is 'none'.
                compressor = effective_compressor(
                    self.compressor(plan.get(name, "none")), torch.Size(layer.shape)
                )
                dtype = layer.torch_dtype
                if layer.sparse_bytes is not None:
                    # Never compressed: gloo's sparse all-reduce gathers every rank's values
                    # and indices (alone in its bucket, so the key is its own).
                    payloads[(Collective.ALL_GATHER, torch.uint8)] += layer.sparse_bytes
                    continue
                if type(compressor) is NoCompression:
                    payloads[(Collective.ALL_REDUCE, dtype)] += layer.bytes
                    continue
                collective = compressor.collective
                kind = (
                    compressor.payload_dtype(dtype)
                    if collective is Collective.ALL_REDUCE
                    else torch.uint8
                )
                shape = torch.Size(layer.shape)
                rounds = compressor.round_wire_bytes(shape, dtype)
                if len(rounds) > 1:
                    # The first round shares the bucket's all-reduce of its dtype (the hook
                    # joins small plain parts to it, all of them in the last bucket); the
                    # final round is a collective of its own.
                    payloads[(collective, kind)] += rounds[0]
                    first_bytes[collective] += rounds[0]
                    for size in rounds[1:]:
                        payloads[(collective, "final")] += size  # type: ignore[index]
                else:
                    payloads[(collective, kind)] += rounds[0]
                sending, between, decoding = self._layer_cost(compressor, layer, world, costs)
                bucket_local += sending
                bucket_final += between
                bucket_decode += decoding
            seconds = 0.0
            for (collective, kind), size in payloads.items():
                seconds += collective_seconds(collective, size, world, link)
                if isinstance(kind, torch.dtype) and collective is Collective.ALL_REDUCE:
                    # gloo sums halves on the CPU, slower than their bytes (measured).
                    per_element = costs.half_sum_seconds_per_element(kind)
                    seconds += per_element * (size // kind.itemsize)
                wire_total += size
                sent_total += link_bytes(collective, size, world)
            # The first rounds' bandwidth term (their latency is the bucket's all-reduce's);
            # the final rounds are collectives of their own.
            first = math.fsum(
                collective_seconds(c, size, world, link) - collective_seconds(c, 0, world, link)
                for c, size in first_bytes.items()
            )
            second = math.fsum(
                collective_seconds(c, size, world, link)
                for (c, kind), size in payloads.items()
                if kind == "final"
            )
            ready.append(bucket.ready_s)
            comm.append(seconds)
            local.append(bucket_local)
            decode.append(bucket_decode)
            round_seconds.append((min(first, seconds), min(second, max(0.0, seconds - first))))
            final_work.append(bucket_final)
        order = sorted(range(len(ready)), key=lambda i: ready[i])
        pipeline = simulate_pipeline(
            [ready[i] for i in order],
            [comm[i] for i in order],
            [local[i] for i in order],
            [decode[i] for i in order],
            contention=costs.contention_rate_at(link.bandwidth_bytes_per_s),
            rounds=[round_seconds[i] for i in order],
            final_work=[final_work[i] for i in order],
        )
        return pipeline, wire_total, sent_total

    def adaptive_decision(self, scenario: Scenario) -> PolicyDecision:
        """The plan the adaptive controller would pick on this link (warm-up 0)."""
        costs = self.cost_model(scenario.world_size)
        costs.update_link(scenario.link)
        engine = PolicyEngine(self.rules, costs, target_overlap=self.target_overlap)
        timing = self.model.timing
        sparse = sparse_pins(layer.name for layer in self.model.layers if layer.sparse)
        return engine.decide(
            self.layer_profiles(),
            StepTiming(
                backward_seconds=timing.backward_s,
                hideable_seconds=timing.hideable_s,
                step_seconds=timing.step_s,
                compute_seconds=timing.compute_step_s,
                bucket_hideable_seconds={
                    b.index: max(0.0, timing.last_bucket_ready_s - b.ready_s)
                    for b in self.model.buckets
                },
            ),
            step=0,
            world_size=scenario.world_size,
            pins=sparse,
        )

    def evaluate(self, scenario: Scenario) -> Evaluation:
        """Predicted step of every option."""
        costs = self.cost_model(scenario.world_size)
        costs.update_link(scenario.link)
        compute = self.model.timing.compute_step_s
        decision: PolicyDecision | None = None
        rows: list[tuple[Option, dict[str, str], Timeline, int, float]] = []
        for option in self.config.options:
            if option.spec is None:
                decision = self.adaptive_decision(scenario)
                plan = {d.name: d.spec for d in decision.layers}
            else:
                plan = self.uniform_plan(option.spec)
            pipeline, wire, sent = self.simulate(plan, scenario, costs)
            rows.append((option, plan, pipeline, wire, sent))
        baseline = compute + rows[0][2].added_s
        results = []
        for option, plan, pipeline, wire, sent in rows:
            step = compute + pipeline.added_s
            results.append(
                OptionResult(
                    key=option.key,
                    label=option.label,
                    plan=plan,
                    compressed_layers=sum(1 for s in plan.values() if s != "none"),
                    wire_bytes=wire,
                    link_bytes=sent,
                    comm_s=pipeline.comm_s,
                    compress_s=pipeline.work_s,
                    exposed_s=pipeline.exposed_s,
                    step_s=step,
                    efficiency=compute / step,
                    speedup=baseline / step,
                    overlap=pipeline.overlap,
                    rel_error=self.plan_error(plan),
                    progress=self.plan_progress(plan),
                )
            )
        return Evaluation(
            scenario=scenario, compute_step_s=compute, results=tuple(results), decision=decision
        )

    def plan_error(self, plan: Mapping[str, str]) -> float:
        """sqrt(sum e_l^2 |g_l|^2 / sum |g_l|^2): a step's error in use over its gradient's norm."""
        return math.sqrt(self._mean_squared_error(plan, mode="grad_norm", by_family=False))

    def plan_progress(self, plan: Mapping[str, str]) -> float:
        """The share of an uncompressed step's progress one step of ``plan`` delivers:
        ``1 - error_cost x`` the weighted mean of ``w_f e_l^2``, as the engine prices error:
        layers weighed by the policy's ``error_weight``, ``w_f`` the family weight
        (``ErrorPriors.progress_weight_by_family``)."""
        mean = self._mean_squared_error(plan, mode=self.rules.error_weight, by_family=True)
        return max(0.0, 1.0 - self.rules.error_cost * mean)

    def _mean_squared_error(self, plan: Mapping[str, str], *, mode: str, by_family: bool) -> float:
        """Mean of e_l^2 over the layers, each weighed as ``error_weight = mode`` weighs it
        (:func:`~autocomp.policy.rules.error_weight`), each term times its family weight when
        ``by_family``."""
        num = den = 0.0
        for name, layer in self.layers.items():
            norm = layer.grad_norm if layer.grad_norm > 0 else 0.0
            weight = error_weight(mode, layer.numel, norm, layer.nonzero_share, layer.grad_l1)
            den += weight
            spec = plan.get(name, "none")
            if spec != "none":
                family = 1.0
                if by_family:
                    family = self._priors.progress_weight(self.compressor(spec))
                num += family * self.rel_error(spec, layer) ** 2 * weight
        return num / den if den > 0 else 0.0

    def sweep(
        self,
        bandwidths: Iterable[float],
        *,
        world_size: int,
        latency_s: float,
        payload_efficiency: float = 1.0,
    ) -> dict[str, list[float]]:
        """Step time of every option at each bandwidth (bytes/s), keyed by option."""
        out: dict[str, list[float]] = {option.key: [] for option in self.config.options}
        for bandwidth in bandwidths:
            scenario = Scenario(
                bandwidth_bytes_per_s=bandwidth,
                latency_s=latency_s,
                world_size=world_size,
                payload_efficiency=payload_efficiency,
            )
            for result in self.evaluate(scenario).results:
                out[result.key].append(result.step_s)
        return out

    def top_layers(self, count: int = 5) -> tuple[tuple[str, int, float], ...]:
        """The layers carrying the most gradient bytes, with their share."""
        total = self.model.total_bytes or 1
        ranked = sorted(self.model.layers, key=lambda layer: (-layer.sent_bytes, layer.name))
        return tuple(
            (layer.name, layer.sent_bytes, layer.sent_bytes / total) for layer in ranked[:count]
        )

    # ---- the verdict -----------------------------------------------------------------------

    def verdict(self, evaluation: Evaluation) -> Verdict:
        """compress / does not pay / in between, with reasons (thresholds in Config)."""
        return judge(self, evaluation)
