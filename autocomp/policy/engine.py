"""The policy engine: which compressor every layer uses for the next steps, and why.

A decision has two stages. Rules come first, in this order, each recording its reason:
warmup, the operator's force-none override, pins (code pins, then the policy's; first match
wins), tiny tensors, 1-D tensors, a single rank, no bandwidth measured yet, a fast link, and
the dwell rule (a layer that changed compressor recently keeps it). The warm-up claims only
the layers with no option accurate enough for it (``PolicyRules.warmup_max_error``: fp16 and
int8 pass by default); the others go on, limited to those options. The layers no rule claims
go to the plan search (:mod:`autocomp.policy.search`) with their usable candidates (those
that would compress the layer into fewer bytes than 'none'), minus the heaviest ones a guard
back-off forbids: the least total compression error among the plans whose predicted step is
within ``time_slack`` of the fastest plan's, or that hide ``target_overlap`` of their
communication, then moved towards more accurate options while the predicted progress per
second rises. When measured steps showed compression not paying
(:class:`~autocomp.policy.payoff.PayoffCheck`), or the plan's predicted gain does not buy back
the per-step progress its error costs (``error_cost``), those layers stay uncompressed.

Costs of an option: :mod:`autocomp.policy.costs`. Every bucket pays one all-reduce latency
whatever the plan (counted from ``LayerProfile.bucket``, or estimated from sizes and
``Config.bucket_cap_bytes``). Errors: :mod:`autocomp.policy.priors`. Predictions of exposure
and step time: :mod:`autocomp.exposure`, the same model the profiler, the window records and
the advisor use.

Determinism: identical inputs (including the cost model's answers) give identical decisions;
rank 0 decides and broadcasts, and tests rely on it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from autocomp.compressors import (
    Collective,
    Compressor,
    NoCompression,
    effective_compressor,
)
from autocomp.policy.costs import LatencyCache, OptionCost, latency_shares, option_cost
from autocomp.policy.explain import optimizer_decision, option_decision
from autocomp.policy.optimizer import LayerOption
from autocomp.policy.payoff import gain_bar
from autocomp.policy.plan_load import BucketGroups, GroupLoad, LoadTerms
from autocomp.policy.priors import ErrorPriors, built, model_scaled, rel_error
from autocomp.policy.progress import progress_rate
from autocomp.policy.ride_along import cast_only_buckets, completions, lossless_cast, riders
from autocomp.policy.rules import Pin, PolicyRules, error_weight, runtime_pins
from autocomp.policy.search import Pending, SearchConfig, search
from autocomp.policy.types import (
    NONE_SPEC,
    RULE_DWELL,
    RULE_FAST_LINK,
    RULE_FORCE_NONE,
    RULE_NO_BANDWIDTH,
    RULE_NO_GAIN,
    RULE_ONE_D,
    RULE_PIN,
    RULE_RIDE_ALONG,
    RULE_SINGLE_RANK,
    RULE_TOO_SMALL,
    RULE_WARMUP,
    CostModelProtocol,
    LayerDecision,
    LayerProfile,
    PolicyDecision,
    StepTiming,
)

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

_NO_BACKOFF: Mapping[str, int] = MappingProxyType({})


class PolicyEngine:
    """Decides every layer's compressor from the rules, the cost model and the profiles."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Engine settings."""

        resolution: int = 2000
        """Budget units of the knapsack program."""
        bucket_cap_bytes: int = 25 * 1024 * 1024
        """DDP's bucket size (its default bucket_cap_mb=25), to count buckets when unknown."""
        priors: ErrorPriors = field(default_factory=ErrorPriors)
        """Relative errors used until the profiler measures them."""
        switch_margin: float = 0.15
        """Hysteresis: the new plan must be this much more accurate than the current one,
        which is still acceptable, to replace it; in the knapsack each layer's current option
        looks this much cheaper and more accurate (ties keep the plan)."""
        useless_error: float = 0.95
        """Relative error at or above which an option sends almost nothing of the gradient,
        judged times the square root of its family's progress weight (top-k at 0.71 and up).
        Not 0.9: PowerSGD rank 4 measures 0.9-0.95 in use under error feedback (its prior
        is 0.92) and still delivers 0.70-0.88 of an uncompressed step on the GPT LM. At 0.9
        the rule took rank 4 off the GPT LM's attention projections for int8, which stepped
        9-10% slower (docs/benchmarks-history.md, twenty-first session)."""
        much_better: float = 0.25
        """A near-useless option is dropped when another is this much more accurate
        (absolute relative error) and costs the layer at most the time slack more, the
        layers' extra costs together within that one slack."""
        hopeless_error: float = 0.95
        """Relative error at or above which a near-useless option sends nothing a layer can
        train on: its drop gets the shared slack first, the worst first. At the default
        ``useless_error`` every near-useless option is hopeless; the band below it is for
        a caller that sets ``useless_error`` lower."""
        dwell_max_loss: float = 0.1
        """Dwell locks are dropped when the locked plan's predicted progress per second falls
        this fraction below the plan the search takes without them (the situation changed
        too much for a lock that only guards against noise), at the caller's second such
        decision in a row (``release_locks``)."""

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
        if not isinstance(cost_model, CostModelProtocol):
            missing = [
                name
                for name in (
                    "comm_seconds",
                    "compress_seconds",
                    "bandwidth_bytes_per_s",
                    "contention_rate",
                    "half_sum_seconds_per_element",
                )
                if not hasattr(cost_model, name)
            ]
            raise TypeError(
                f"{type(cost_model).__name__} is not a cost model for the policy engine: "
                f"missing {', '.join(missing)} (see autocomp.policy.CostModelProtocol)"
            )
        self.rules = rules
        self.cost_model = cost_model
        self.target_overlap = float(target_overlap)
        self.config = config or PolicyEngine.Config()
        if self.config.bucket_cap_bytes < 1:
            raise ValueError("bucket_cap_bytes must be >= 1")
        self._candidates: tuple[Compressor, ...] = tuple(built(s) for s in rules.candidates)
        self._priors = self.config.priors
        """The priors of the decision in progress, at this model's measured level
        (:func:`~autocomp.policy.priors.model_scaled`)."""
        self._cast_only_latency: tuple[Sequence[LayerProfile], BucketGroups, float] = (
            (),
            BucketGroups((), ()),
            0.0,
        )
        """The decision in progress's layers, groups and per-bucket all-reduce latency, for
        :meth:`_latency_of`."""

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
        locked: Mapping[str, str] | None = None,
        warmup_done: bool | None = None,
        release_locks: bool = True,
        compression_measured: bool = True,
    ) -> PolicyDecision:
        """The plan for the next steps; see the module docstring.

        Args:
            layers: one profile per parameter, in a fixed order (the decision keeps it).
            timing: recent step timing (H, per-bucket H, the compute-only step).
            step: current step (warmup compares against it).
            world_size: ranks in the group.
            backoff: guard back-off levels by layer name; a level forbids that many of the
                layer's heaviest candidates (lightest = lowest prior error, 'none' first).
            pins: (glob, spec) pairs tried before the policy's own pins, first match wins.
            force_none: operator override, every layer uncompressed.
            current: each layer's spec in use now (hysteresis).
            hold_reason: set when measurements showed compression not paying here: the
                layers the search would decide stay uncompressed (rule ``no_gain``).
            locked: layers that must keep their current spec (the caller's dwell rule),
                honoured while that spec is still a candidate and the plan stays close to the
                fastest one (see ``Config.dwell_max_loss``).
            warmup_done: overrides ``step < rules.warmup_steps`` (the adaptive loop ends the
                warm-up early on a link much slower than the backward). In the warm-up only
                options within ``rules.warmup_max_error`` are candidates.
            release_locks: whether locks the unlocked plan outlearns by ``dwell_max_loss``
                are dropped now; False holds them and only reports it
                (``PolicyDecision.locks_outvoted``). The planner passes True only after one
                such decision, so one window's noise cannot release them.
            compression_measured: the compression in use has measured its gain over an
                uncompressed window (``PayoffCheck.compression_measured``). Until it has, a
                plan must be predicted to save ``rules.min_gain`` of the uncompressed step,
                the gain the payoff check will demand of it (see ``_compression_pays``).
        """
        names = [layer.name for layer in layers]
        self._priors = model_scaled(self.config.priors, layers)
        if len(set(names)) != len(names):
            raise ValueError("layer names must be unique")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        for name, levels in backoff.items():
            if isinstance(levels, bool) or not isinstance(levels, int) or levels < 0:
                raise ValueError(f"backoff[{name!r}] must be an integer >= 0, got {levels!r}")
        in_warmup = step < self.rules.warmup_steps if warmup_done is None else not warmup_done
        all_pins = (*runtime_pins(pins), *self.rules.pins)
        bandwidth = self.cost_model.bandwidth_bytes_per_s
        latency = LatencyCache(self.cost_model, world_size)

        decisions: list[LayerDecision | None] = [None] * len(layers)
        pending: list[Pending] = []
        ruled_by_index = [
            self._rule(layer, in_warmup, step, world_size, bandwidth, all_pins, force_none)
            for layer in layers
        ]
        buckets = self._bucket_count(layers)
        sharing = latency_shares(
            [layer for layer, ruled in zip(layers, ruled_by_index, strict=True) if ruled is None],
            buckets,
        )
        max_error = self.rules.warmup_max_error if in_warmup else None
        for index, (layer, ruled) in enumerate(zip(layers, ruled_by_index, strict=True)):
            if ruled is not None:
                rule, spec, reason = ruled
                decisions[index] = self._fixed(layer, rule, spec, reason, latency)
            else:
                in_use = None if current is None else current.get(layer.name)
                in_use = None if in_use is None else built(in_use).spec
                levels = backoff.get(layer.name, 0)
                share = sharing[layer.name]
                pending.append(
                    self._pending(index, layer, levels, latency, in_use, share, max_error)
                )

        per_bucket_latency = latency.of(Collective.ALL_REDUCE) if world_size > 1 else 0.0
        groups = BucketGroups.build(layers, timing, self._contention())
        # Without bucket indices the single group's bucket count is the estimate from sizes.
        counted = [g.buckets or buckets for g in groups.groups]
        latency_by_group = [per_bucket_latency * count for count in counted]
        solver = ""
        fastest_step: float | None = None
        outvoted = False
        searched = pending  # the hold below rebinds pending, the decisions keep its layers
        if pending and hold_reason is not None:
            for item in pending:
                decisions[item.index] = self._none(item, hold_reason)
            pending = []
            solver = "held"
        required_gain, uncompressed_step = 0.0, None
        self._cast_only_latency = (layers, groups, per_bucket_latency)
        if pending:
            solver, fastest_step, outvoted = self._search(
                pending, decisions, groups, latency_by_group, timing, locked or {}, release_locks
            )
            self._complete_casts(
                layers, pending, decisions, groups, latency_by_group, timing, latency
            )
            pays, required_gain, uncompressed_step = self._compression_pays(
                pending, decisions, groups, latency_by_group, timing, current, compression_measured
            )
            if not pays:  # the optimizer's layers were set to 'none'
                solver, required_gain = f"{solver}, none: gain under the error's cost", 0.0
        self._ride(layers, decisions, latency)

        final = tuple(d for d in decisions if d is not None)
        load = self._load(
            decisions, groups, self._latency_of(decisions, latency_by_group), searched
        )
        timeline = groups.timeline(load)
        total = timeline.comm_s + timeline.work_s
        target = self.target_overlap
        hideable = timing.hideable_seconds
        decision = PolicyDecision(
            step=step,
            policy=self.rules.name,
            layers=final,
            world_size=world_size,
            bandwidth_bytes_per_s=bandwidth,
            target_overlap=target,
            hideable_seconds=hideable,
            budget_seconds=hideable / target if target > 0 else math.inf,
            latency_seconds=buckets * per_bucket_latency,
            buckets=buckets,
            predicted_comm_seconds=total,
            predicted_exposed_seconds=timeline.exposed_s,
            predicted_overlap=timeline.overlap,
            predicted_error=math.fsum(d.predicted_error for d in final),
            predicted_wire_bytes=sum(d.predicted_wire_bytes for d in final),
            feasible=timeline.exposed_s <= (1.0 - target) * total * (1 + 1e-9) + 1e-12,
            solver=solver,
            compute_seconds=timing.compute,
            sync_seconds=timing.sync_seconds,
            predicted_step_seconds=timing.base + timeline.added_s,
            fastest_step_seconds=fastest_step,
            time_slack=self.rules.time_slack,
            required_gain=required_gain,
            uncompressed_step_seconds=uncompressed_step,
            contention_rate=groups.contention,
            predicted_contention_seconds=timeline.contention_s,
            locks_outvoted=outvoted,
        )
        logger.debug(
            "step %d: predicted step %.4g s (compute %.4g, gap %.4g, fastest %s), overlap %.3f, "
            "%d/%d layers compressed",
            step,
            decision.predicted_step_seconds,
            timing.compute,
            timing.sync_seconds,
            "n/a" if fastest_step is None else f"{fastest_step:.4g}",
            timeline.overlap,
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
                priors.rel_error(c, layer.shape, layer.nonzero_share),
                -c.wire_bytes(layer.shape, layer.dtype),
                c.spec,
            ),
        )

    # ---- the plan search -------------------------------------------------------------------

    def _contention(self) -> float:
        """The exposure model's contention (backward seconds lost per busy link second), from
        the cost model's measured contention."""
        return float(self.cost_model.contention_rate())

    def _search_config(self) -> SearchConfig:
        cfg = self.config
        return SearchConfig(
            time_slack=self.rules.time_slack,
            target_overlap=self.target_overlap,
            switch_margin=cfg.switch_margin,
            useless_error=cfg.useless_error,
            much_better=cfg.much_better,
            hopeless_error=cfg.hopeless_error,
            useless_min_numel=self.rules.useless_min_numel,
            resolution=cfg.resolution,
        )

    def _search(
        self,
        pending: list[Pending],
        decisions: list[LayerDecision | None],
        groups: BucketGroups,
        latency_by_group: Sequence[float],
        timing: StepTiming,
        locked: Mapping[str, str],
        release_locks: bool,
    ) -> tuple[str, float, bool]:
        """Fill ``decisions`` for the pending layers; returns (solver, fastest step, whether
        the unlocked plan outlearned the locked one by ``dwell_max_loss``)."""
        config = self._search_config()
        total_weight = math.fsum(self._weight(item.layer) for item in pending)
        if total_weight > 0:
            config.progress_per_error = self.rules.error_cost / total_weight
        locked = {name: built(spec).spec for name, spec in locked.items()}
        free = [item for item in pending if item.layer.name not in locked]
        held = [
            item
            for item in pending
            if item.layer.name in locked
            and any(o.key == locked[item.layer.name] for o in item.options)
        ]
        free += [item for item in pending if item.layer.name in locked and item not in held]
        free.sort(key=lambda p: p.index)
        fixed = self._load(decisions, groups, latency_by_group)
        with_held = fixed.copy()
        for item in held:
            with_held.add(
                groups.group_of[item.index], item.option(locked[item.layer.name]), item.layer.bucket
            )
        result = None
        outvoted = False
        if free or held:
            unlocked = None
            if held:
                # The search without the locks: the free layers' T* and slack are its own, and
                # locks hold while the locked plan learns per second within dwell_max_loss of it.
                unlocked_items = [self._copy(item) for item in pending]
                unlocked = search(unlocked_items, groups, fixed, timing, config)
            if free:
                result = search(free, groups, with_held, timing, config, reference=unlocked)
            if unlocked is not None:
                added = (
                    result.timeline.added_s
                    if result is not None
                    else groups.timeline(with_held).added_s
                )
                locked_error = math.fsum(
                    item.option(locked[item.layer.name]).error for item in held
                ) + (math.fsum(o.error for o in result.chosen) if result is not None else 0.0)
                unlocked_error = math.fsum(o.error for o in unlocked.chosen)
                per_error = config.progress_per_error
                locked_rate = progress_rate(timing.base + added, locked_error, per_error)
                free_rate = progress_rate(
                    timing.base + unlocked.timeline.added_s, unlocked_error, per_error
                )
                outvoted = locked_rate < (1.0 - self.config.dwell_max_loss) * free_rate
                if outvoted and release_locks:
                    held, free, result = [], unlocked_items, unlocked
        for item in held:
            option = item.option(locked[item.layer.name])
            reason = (
                f"{item.note}dwell: changed compressor recently, kept {option.key} "
                f"(predicts {option.seconds:.3g} s, rel. error "
                f"{item.rel_errors[option.key]:.3g})"
            )
            decisions[item.index] = option_decision(item, option, reason, RULE_DWELL)
        if result is None:
            return "dwell", timing.base, outvoted
        for item, chosen, runner in zip(free, result.chosen, result.runner_ups, strict=True):
            decisions[item.index] = optimizer_decision(
                item,
                chosen,
                runner,
                result,
                slack=config.time_slack,
                target=config.target_overlap,
                margin=config.switch_margin,
            )
        solver = result.method + (" (+dwell)" if held else "")
        return solver, timing.base + result.fastest_added, outvoted

    def _compression_pays(
        self,
        pending: Sequence[Pending],
        decisions: list[LayerDecision | None],
        groups: BucketGroups,
        latency_by_group: Sequence[float],
        timing: StepTiming,
        current: Mapping[str, str] | None,
        compression_measured: bool = True,
    ) -> tuple[bool, float, float]:
        """(pays, required gain, predicted uncompressed step) of the searched plan; when its
        predicted gain falls short, the pending layers are set to 'none' in ``decisions``.

        Progress per second is (progress per step) / (step time). Compression shortens the
        step and costs per-step progress; linearized, a step delivers ``1 - error_cost x
        mean_err2`` of an uncompressed step's progress, ``mean_err2`` being the weighted mean
        squared relative error over the optimizer's layers (uncompressed ones count 0; each
        family's error times its progress weight, ``ErrorPriors.progress_weight_by_family``). So the
        plan pays only if it shortens the step by at least that share. The slack rule inside
        the search cannot see this: it compares compressed plans with each other, and on a
        fast link the fastest plan may save 5% of a step while costing 10-20% of its progress
        (the MLP LM on loopback). A plan already in use keeps its place down to
        ``1 - switch_margin`` of the bar, so a gain near it does not flip the plan each window.

        After a compressed plan measured no payoff, and until the compression in use has
        measured its gain (``compression_measured``), the bar is at least the payoff check's
        (``gain_bar``: ``rules.min_gain``, or ``rules.lossless_min_gain`` for a plan whose
        error costs no progress): the check holds any compressed plan that does not measure
        that much faster than uncompressed, so a plan predicted to save less can only lose
        its windows, and this run has shown its predictions err by more than such a gain. On
        the MLP LM on loopback, fp16 on ``fc1`` predicted 1% faster right after a PowerSGD
        window had measured 28% slower than predicted, and ran a window more at 1.1x.
        """
        chosen = [decisions[item.index] for item in pending]
        if any(d is None for d in chosen):
            raise AssertionError("the search left a pending layer undecided")
        uncompressed = list(decisions)
        for item in pending:
            uncompressed[item.index] = self._none(item, "")
        plain = self._step_of(uncompressed, groups, latency_by_group, timing, pending)
        total_weight = math.fsum(self._weight(item.layer) for item in pending)
        if all(d is not None and d.spec == NONE_SPEC for d in chosen) or plain <= 0:
            return True, 0.0, plain
        if total_weight <= 0:  # no gradient seen (norm weights): nothing to weigh
            return True, 0.0, plain
        mean_err2 = math.fsum(d.predicted_error for d in chosen if d is not None) / total_weight
        required = self.rules.error_cost * mean_err2
        planned = self._step_of(decisions, groups, latency_by_group, timing, pending)
        gain = 1.0 - planned / plain
        in_use = current is not None and any(
            built(current[item.layer.name]).spec != NONE_SPEC
            for item in pending
            if item.layer.name in current
        )
        bar = required * (1.0 - self.config.switch_margin) if in_use else required
        floor_note = ""
        if not compression_measured:
            rules = self.rules
            floor = gain_bar(required, rules.min_gain, rules.lossless_min_gain)
            bar = max(bar, floor)
            floor_note = f" or the {floor:.0%} an unmeasured plan needs"
        if gain >= bar:
            return True, required, plain
        reason = (
            f"no gain: the plan predicted {gain:.1%} off the step "
            f"({planned * 1e3:,.4g} vs {plain * 1e3:,.4g} ms uncompressed), under the "
            f"{bar:.1%} of per-step progress its error costs (error_cost "
            f"{self.rules.error_cost:g} x mean squared relative error {mean_err2:.3g})"
            f"{floor_note}"
        )
        for item in pending:
            decisions[item.index] = self._none(item, reason)
        return False, required, plain

    def _step_of(
        self,
        decisions: Sequence[LayerDecision | None],
        groups: BucketGroups,
        latency_by_group: Sequence[float],
        timing: StepTiming,
        items: Sequence[Pending] = (),
    ) -> float:
        load = self._load(decisions, groups, self._latency_of(decisions, latency_by_group), items)
        timeline = groups.timeline(load)
        return timing.base + timeline.added_s

    def _latency_of(
        self, decisions: Sequence[LayerDecision | None], latency_by_group: Sequence[float]
    ) -> list[float]:
        """The per-group latency of the buckets' own-dtype all-reduces: one per bucket, less
        one for each bucket that sends only its lossless cast (``cast_only_buckets``: the
        cast's collective, charged to its layers, is then the bucket's only all-reduce)."""
        out = list(latency_by_group)
        layers, groups, per_bucket = self._cast_only_latency
        if per_bucket <= 0 or len(decisions) != len(layers):
            return out
        group_of_bucket = {layer.bucket: groups.group_of[i] for i, layer in enumerate(layers)}
        for bucket in cast_only_buckets(layers, decisions):
            group = group_of_bucket[bucket]
            out[group] = max(0.0, out[group] - per_bucket)
        return out

    def _ride(
        self,
        layers: Sequence[LayerProfile],
        decisions: list[LayerDecision | None],
        latency: LatencyCache,
    ) -> None:
        """Put the layers that ride along with their bucket's cast on it (``riders``)."""
        rates = self._span_rates(layers, decisions)
        for index, spec in riders(layers, decisions).items():
            held = decisions[index]
            assert held is not None
            reason = (
                f"rides along with its bucket's {spec}: one collective for the bucket "
                f"(held from lossy options: {held.reason})"
            )
            # The bucket's cast collective is there already: a rider adds bytes and work only.
            rider = self._fixed(
                layers[index], RULE_RIDE_ALONG, spec, reason, latency, share=math.inf
            )
            decisions[index] = _in_span(rider, layers[index], rates.get(layers[index].bucket))

    def _span_rates(
        self, layers: Sequence[LayerProfile], decisions: Sequence[LayerDecision | None]
    ) -> dict[int | None, float]:
        """Per bucket, the least cast work per element among its layers on a lossless cast:
        what a layer that joins the bucket's cast span costs per element. On CPU the hook
        casts, sends and copies back consecutive cast layers as one span
        (:mod:`autocomp.hook_cast_span`), whose measured time is shared out by size, so a
        small layer joining it adds its elements' share, not the per-tensor price its own
        options carry (the ViT at 500 Mbit/s priced fp16 at 70-80 us on a 96x96 matrix and
        280 us on a 96-element bias, measured on the per-layer path; the whole bucket-wide
        cast and copy back of its 450k elements takes 0.13 ms). Empty on CUDA, where the
        per-layer path stays."""
        if getattr(getattr(self.cost_model, "config", None), "device_type", "cpu") != "cpu":
            return {}
        rates: dict[int | None, float] = {}
        for layer, decided in zip(layers, decisions, strict=True):
            if decided is None or layer.numel <= 0 or decided.predicted_work_seconds <= 0:
                continue
            if decided.rule == RULE_RIDE_ALONG or not lossless_cast(decided.spec):
                continue
            rate = decided.predicted_work_seconds / layer.numel
            rates[layer.bucket] = min(rate, rates.get(layer.bucket, rate))
        return rates

    def _complete_casts(
        self,
        layers: Sequence[LayerProfile],
        pending: Sequence[Pending],
        decisions: list[LayerDecision | None],
        groups: BucketGroups,
        latency_by_group: Sequence[float],
        timing: StepTiming,
        latency: LatencyCache,
    ) -> None:
        """Put the searched layers the search left at 'none' on their bucket's lossless cast
        where that drops the bucket's float32 all-reduce and the exposure model predicts the
        step no longer (``ride_along.completions``), bucket by bucket.

        The search prices each layer's options apart, every bucket's own-dtype all-reduce as
        paid whatever the plan, and the cast per tensor, so a small matrix's fp16 looks like
        a loss beside its float32 collective; the bucket-wide saving is seen only here. On
        the digits ViT at 500 Mbit/s it left 11 of 19 matrices uncompressed beside fp16 ones
        (fifty-second session)."""
        by_index = {item.index: item for item in pending}
        proposal = completions(layers, decisions, list(by_index))
        rates = self._span_rates(layers, decisions)
        by_bucket: dict[int | None, dict[int, str]] = {}
        for index, spec in proposal.items():
            by_bucket.setdefault(layers[index].bucket, {})[index] = spec
        before: float | None = None  # the plan as it stands, riders on (set when needed)
        for bucket_proposal in by_bucket.values():
            trial = list(decisions)
            for index, spec in bucket_proposal.items():
                old, item = decisions[index], by_index[index]
                option = next((o for o in item.options if o.key == spec), None)
                if old is None or old.rule == RULE_DWELL or option is None:
                    break
                reason = (
                    f"completes its bucket's {spec}: the bucket sends no float32 "
                    f"all-reduce (the search alone: {old.reason})"
                )
                completed = option_decision(item, option, reason, old.rule)
                trial[index] = _in_span(completed, layers[index], rates.get(layers[index].bucket))
            else:
                # Both sides as they would be sent: with their riders on the cast or not.
                if before is None:
                    ridden = list(decisions)
                    self._ride(layers, ridden, latency)
                    before = self._step_of(ridden, groups, latency_by_group, timing, pending)
                self._ride(layers, trial, latency)
                after = self._step_of(trial, groups, latency_by_group, timing, pending)
                if after <= before:
                    for index in bucket_proposal:
                        decisions[index] = trial[index]
                    before = after

    @staticmethod
    def _load(
        decisions: Sequence[LayerDecision | None],
        groups: BucketGroups,
        latency_by_group: Sequence[float],
        items: Sequence[Pending] = (),
    ) -> GroupLoad:
        """What the decided layers and the per-bucket latency put on each group; ``items``,
        the optimizer's layers, also name the collectives their options add to a bucket
        (``GroupLoad.own``). A rule's layer (a pin) is charged its collective's full latency
        and not noted, so a searched layer of the same kind in its bucket is priced as if it
        were alone there: an over-charge of at most one latency, on pinned plans only."""
        load = GroupLoad.empty(len(groups.groups))
        entries = [
            (index, LoadTerms.of_seconds(comm=latency), None)
            for index, latency in enumerate(latency_by_group)
        ]
        for index, decided in enumerate(decisions):
            if decided is None:
                continue
            first, second = decided.predicted_rounds_seconds
            final_work, decode = decided.predicted_late_work_seconds
            terms = LoadTerms.of_seconds(
                comm=decided.predicted_seconds - decided.predicted_work_seconds,
                work=decided.predicted_work_seconds,
                first=first,
                second=second,
                final_work=final_work,
                decode=decode,
            )
            entries.append((groups.group_of[index], terms, None))
        load.add_all(entries)
        for item in items:
            decided = decisions[item.index]
            if decided is None:
                continue
            option = next((o for o in item.options if o.key == decided.spec), None)
            if option is not None:
                load.note_own(groups.group_of[item.index], option, item.layer.bucket)
        return load

    @staticmethod
    def _copy(item: Pending) -> Pending:
        """A search item the search may drop options from without touching ``item``."""
        return replace(item, options=list(item.options), dropped={})

    # ---- rules -----------------------------------------------------------------------------

    def _rule(
        self,
        layer: LayerProfile,
        in_warmup: bool,
        step: int,
        world_size: int,
        bandwidth: float | None,
        pins: Sequence[Pin],
        force_none: bool,
    ) -> tuple[str, str, str] | None:
        """(rule, spec, reason) when a rule decides the layer, else None."""
        rules = self.rules
        pin = next((p for p in pins if p.matches(layer.name)), None)
        if in_warmup:
            # Only options that send the gradient almost whole run in the warm-up (a pin
            # included): see ``PolicyRules.warmup_max_error``.
            allowed = [built(pin.compressor)] if pin is not None else self._candidates
            if not any(self._warmup_safe(c, layer) for c in allowed):
                return (
                    RULE_WARMUP,
                    NONE_SPEC,
                    f"warmup: step {step} < warmup_steps {rules.warmup_steps}",
                )
        if force_none:
            return RULE_FORCE_NONE, NONE_SPEC, "operator override: force none"
        if pin is not None:
            pinned = effective_compressor(built(pin.compressor), layer.shape)
            if pinned.spec != built(pin.compressor).spec:
                # Priced and sent as the hook runs it (PowerSGD on a 1-D tensor: 'none').
                return RULE_PIN, pinned.spec, f"pinned by {pin.match}; sent whole as none"
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
        if compressor.sends_as_is(layer.shape):
            return False
        return compressor.wire_bytes(layer.shape, layer.dtype) < layer.raw_bytes

    def _warmup_safe(self, compressor: Compressor, layer: LayerProfile) -> bool:
        """Whether the warm-up admits ``compressor`` on ``layer``: it compresses the layer
        with a relative error (measured, else the prior) of at most ``warmup_max_error``."""
        if isinstance(compressor, NoCompression) or not self._usable(compressor, layer):
            return False
        limit = self.rules.warmup_max_error
        return limit > 0 and rel_error(compressor, layer, self._priors) <= limit

    def _fixed(
        self,
        layer: LayerProfile,
        rule: str,
        spec: str,
        reason: str,
        latency: LatencyCache,
        share: float = 1.0,
    ) -> LayerDecision:
        compressor = built(spec)
        if latency.world_size > 1:
            cost = option_cost(compressor, layer, latency, share)
        else:
            cost = OptionCost(0.0, 0.0, compressor.wire_bytes(layer.shape, layer.dtype))
        error = self._error(compressor, layer, rel_error(compressor, layer, self._priors))
        return LayerDecision(
            name=layer.name,
            spec=compressor.spec,
            reason=reason,
            rule=rule,
            predicted_seconds=cost.seconds,
            predicted_work_seconds=cost.work,
            predicted_rounds_seconds=(cost.first_round, cost.second_round),
            predicted_late_work_seconds=(cost.final_work, cost.decode),
            predicted_wire_bytes=cost.wire,
            predicted_error=error,
        )

    def _pending(
        self,
        index: int,
        layer: LayerProfile,
        levels: int,
        latency: LatencyCache,
        in_use: str | None = None,
        share: float = 1.0,
        max_error: float | None = None,
    ) -> Pending:
        """The layer's search item; ``max_error`` (the warm-up) keeps only 'none' and the
        options :meth:`_warmup_safe` admits (their relative error, computed once here)."""
        ordered = self.lightness_order(layer)
        note = ""
        if levels > 0:
            keep = max(1, len(ordered) - levels)
            dropped = ordered[keep:]
            ordered = ordered[:keep]
            excluded = ", ".join(c.spec for c in dropped) or "nothing left to exclude"
            note = f"guard back-off by {levels} (excludes {excluded}); "
        if max_error is not None:
            note += f"warm-up: options within relative error {max_error:g} only; "
        options = []
        rel_errors = {}
        progress_errors = {}
        for compressor in ordered:
            rel = rel_error(compressor, layer, self._priors)
            if max_error is not None and rel > max_error:
                continue  # 'none' (0) always stays; ``_rule`` saw a usable one within it
            cost = option_cost(compressor, layer, latency, share)
            rel_errors[compressor.spec] = rel
            progress_errors[compressor.spec] = rel * math.sqrt(
                self.config.priors.progress_weight(compressor)
            )
            error = self._error(compressor, layer, rel)
            options.append(
                LayerOption(
                    compressor.spec,
                    cost.seconds,
                    error,
                    cost.wire,
                    cost.work,
                    cost.first_round,
                    cost.second_round,
                    cost.final_work,
                    cost.decode,
                    cost.own_collective,
                    cost.own_latency,
                    cost.own_charged,
                )
            )
        current = in_use if any(o.key == in_use for o in options) else None
        return Pending(
            index, layer, options, rel_errors, note, current, progress_errors=progress_errors
        )

    def _error(self, compressor: Compressor, layer: LayerProfile, rel: float) -> float:
        """The option's predicted error: its squared relative error, weighted by the layer
        (``error_weight``) and by what its family's error costs in per-step progress."""
        return rel**2 * self._weight(layer) * self.config.priors.progress_weight(compressor)

    def _weight(self, layer: LayerProfile) -> float:
        """What one unit of squared relative error costs on this layer (``error_weight``)."""
        return error_weight(
            self.rules.error_weight,
            layer.numel,
            layer.grad_norm,
            layer.nonzero_share,
            layer.grad_l1,
        )

    def _bucket_count(self, layers: Sequence[LayerProfile]) -> int:
        if not layers:
            return 0
        if all(layer.bucket is not None for layer in layers):
            return len({layer.bucket for layer in layers})
        total = sum(layer.raw_bytes for layer in layers)
        return max(1, math.ceil(total / self.config.bucket_cap_bytes))

    @staticmethod
    def _none(item: Pending, reason: str) -> LayerDecision:
        """A search layer left uncompressed because compression does not pay (measured, or
        predicted against the progress its error costs)."""
        return option_decision(item, item.option(NONE_SPEC), item.note + reason, RULE_NO_GAIN)


def _in_span(decided: LayerDecision, layer: LayerProfile, rate: float | None) -> LayerDecision:
    """``decided`` (a cast) priced as a member of its bucket's cast span: its work at the
    span's per-element ``rate`` when that is less (``PolicyEngine._span_rates``)."""
    work = decided.predicted_work_seconds
    if rate is None or work <= 0 or rate * layer.numel >= work:
        return decided
    scale = rate * layer.numel / work
    final_work, decode = decided.predicted_late_work_seconds
    return replace(
        decided,
        predicted_seconds=decided.predicted_seconds - work * (1.0 - scale),
        predicted_work_seconds=work * scale,
        predicted_late_work_seconds=(final_work * scale, decode * scale),
    )
