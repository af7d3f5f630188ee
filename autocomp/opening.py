"""Before the first step's collectives: read the link and decide whether step 0 compresses.

The adaptive loop's opening (:meth:`~autocomp.adaptive.AdaptiveLoop` at step 0) needs one
agreed reading of the link before any gradient has crossed it, so that a link far slower
than the backward is compressed from the first step: :class:`~autocomp.probe_runner.ProbeRunner`
takes the reading, and :func:`open_plan` decides, for ``WindowPlanner.open``, with the first
forward's time as the compute estimate and :class:`EmbeddingRows`' share of each table's rows
looked up. :func:`warmup_start` picks what step 0 itself runs.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from autocomp.compressors import Collective
from autocomp.link_model import latency_hops, link_bytes
from autocomp.policy.types import LayerProfile, PolicyDecision, StepTiming
from autocomp.probe_runner import OPENING_COMPUTE_PER_FORWARD
from autocomp.window import PlanUpdate, WindowRecord

if TYPE_CHECKING:
    from autocomp.planner import WindowPlanner

logger = logging.getLogger(__name__)

__all__ = [
    "EmbeddingRows",
    "gradient_device",
    "open_plan",
    "untraced",
    "warmup_start",
]


class EmbeddingRows:
    """The share of its rows each embedding table's first training forward looks up.

    A table's gradient is nonzero only in the rows its step looked up, and top-k with error
    feedback sends it whole at any ratio above that share (``policy.priors``). The hook
    measures the share from the first sampled step on, but the opening decides before any
    gradient exists: priced dense there, the n-gram task's 2^17 x 64 table (0.5-0.6% of its
    rows looked up a step) went to PowerSGD rank 4 at 50 Mbit/s, and the look at step 2
    moved it to top-1%, after two steps of a 2 MB factor. Counting the distinct indices of
    the first training forward gives the share before the backward.

    Only tables whose gradient comes from their lookups alone count. A tied output
    projection makes the gradient dense: a weight another module holds is left out, and so
    is one the forward also read outside its module (``x @ emb.weight.T``, the GPT LM's
    head), found in the forward's autograd graph by counting the weight's uses against its
    lookups. Under ``torch.compile`` that count sees a compiled region's uses as one; a wrong
    share there lasts until the first look, which has the measured one. Lookups of one table
    in one forward add up, which can overstate its rows but not understate them.
    Sparse-gradient tables are never compressed and are left out.
    """

    def __init__(self, model: torch.nn.Module, names: dict[int, str]) -> None:
        """``names``: the wrapped parameters' names by ``id``."""
        self.shares: dict[str, float] = {}
        """Rows looked up / rows per table, filled when the first training forward ends."""
        self._rows: dict[str, tuple[int, int]] = {}
        self._lookups: Counter[str] = Counter()
        self._weights: dict[int, str] = {}
        self._done = False
        holders = Counter(
            id(param) for module in model.modules() for param in module.parameters(recurse=False)
        )
        self._handles: list[Any] = []
        for module in model.modules():
            if not isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
                continue
            name = names.get(id(module.weight))
            if name is None or module.sparse or holders[id(module.weight)] != 1:
                continue
            self._weights[id(module.weight)] = name
            hook = untraced(partial(self._looked_up, name))
            self._handles.append(module.register_forward_hook(hook))

    @property
    def watching(self) -> bool:
        """Whether any table is watched (and the first training forward not over)."""
        return bool(self._handles)

    def remove(self) -> None:
        """Remove the forward hooks (at the end of the first forward, or when unwrapped)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _looked_up(self, name: str, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._done or not (torch.is_grad_enabled() and module.training) or not args:
            return
        indices = args[0]
        if not isinstance(indices, torch.Tensor) or indices.is_floating_point():
            return
        distinct = torch.unique(indices.detach())
        looked_up = distinct.numel()
        padding = module.padding_idx
        if padding is not None and bool((distinct == padding % module.num_embeddings).any()):
            looked_up -= 1  # the padding row gets no gradient
        seen, _ = self._rows.get(name, (0, module.num_embeddings))
        self._rows[name] = (seen + looked_up, module.num_embeddings)
        self._lookups[name] += 1

    def forward_done(self, output: Any = None) -> None:
        """The first training forward is over: fix the shares and remove the hooks.
        ``output``: the forward's output, whose autograd graph shows other uses of a table."""
        if self._done:
            return
        self._done = True
        self.remove()
        uses = self._uses(output) if self._rows else Counter()
        self.shares = {
            name: min(1.0, looked_up / rows)
            for name, (looked_up, rows) in self._rows.items()
            if uses[name] <= self._lookups[name]
        }

    def _uses(self, output: Any) -> Counter[str]:
        """How often the graph behind ``output`` reads each watched weight."""
        uses: Counter[str] = Counter()
        stack = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
        seen = set(stack)
        while stack:
            for node, _ in stack.pop().next_functions:
                if node is None:
                    continue
                variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf's use
                if variable is not None:
                    name = self._weights.get(id(variable))
                    if name is not None:
                        uses[name] += 1
                elif node not in seen:
                    seen.add(node)
                    stack.append(node)
        return uses


def untraced(function: Any) -> Any:
    """``function`` as a forward hook compiled code leaves alone (runs eagerly, untraced)."""
    compiler = getattr(torch, "compiler", None)
    disable = getattr(compiler, "disable", None)
    return disable(function) if disable is not None else function


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a forward's output (nested tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def gradient_device(ddp: torch.nn.Module | None) -> torch.device:
    """Where the gradients live: the profiler's clock and the calibration follow it."""
    if ddp is not None:
        for param in ddp.parameters():
            return param.device
    return torch.device("cpu")


def open_plan(
    planner: WindowPlanner,
    probe: tuple[int, float],
    forward_seconds: float,
    world: int,
    current: dict[str, str],
    small_probe: tuple[int, float] | None = None,
) -> PlanUpdate | None:
    """The opening: ``planner``'s plan for step 0 from a link probe run before its first
    collective.

    ``probe`` is (payload bytes, seconds) of an all-reduce timed on the link, and
    ``small_probe`` the same for a small one (``OpeningProbe.latency_probe``), which gives
    the link model its latency; the compute
    is estimated from the first forward (``OPENING_COMPUTE_PER_FORWARD`` times it: a
    backward costs about twice the forward). That estimate can be several times short: an
    embedding table's backward writes a dense gradient its forward never read (the n-gram
    model: 3 x its forward ~15 ms against a measured 93 ms compute-only step, so at 2x
    it compressed on loopback from step 0). So the opening acts only when the uncompressed
    step's predicted communication takes ``opening_ratio`` (5x) that compute: then the
    warm-up ends here and the engine decides, one or two steps before the measured looks
    could (at 10 Mbit/s an uncompressed first step of a 34 MB model takes 30 s; at
    50 Mbit/s the GPT LM's two uncompressed steps took 2.9 s, 24 compressed steps, at a
    ratio of 6.9). A wrong call costs the steps until the look at step 2 or 4 measures
    the compute and the engine sends the plan back to uncompressed. Else None: the plan
    stays, and the probe only seeds the link estimate.
    """
    payload, seconds = probe
    hops = latency_hops(Collective.ALL_REDUCE, world)
    sent = link_bytes(Collective.ALL_REDUCE, payload, world)
    planner.meter.add_probe(hops, sent, seconds)
    if small_probe is not None and small_probe[1] > 0:
        # Two sizes: the meter fits latency and bandwidth together (else latency is a prior).
        planner.meter.add_probe(
            hops, link_bytes(Collective.ALL_REDUCE, small_probe[0], world), small_probe[1]
        )
    if seconds > 0:  # nothing is compressed yet: the payoff check's reference reading
        planner.payoff.note_probe(payload, sent / seconds, compressed=False)
        planner.probe.note_reading(sent / seconds)
    estimate = planner.meter.end_window(min_samples=1)
    if estimate is None or not (math.isfinite(forward_seconds) and forward_seconds > 0):
        return None
    planner.cost_model.update_link(estimate)
    # No gradient seen yet: every element weighs the same, whichever ``error_weight``
    # (a norm of sqrt(numel) makes "grad_norm" weigh like "numel").
    profiles = [
        LayerProfile(
            name=name,
            shape=planner.shapes[name],
            dtype=planner.dtypes[name],
            grad_norm=math.sqrt(math.prod(planner.shapes[name])),
            rel_error={},
            bucket=None,
            sparse_bytes=planner.sparse_bytes.get(name),
            nonzero_share=planner.row_shares.get(name, 1.0),
        )
        for name in planner.names
    ]
    raw_bytes = sum(p.raw_bytes for p in profiles if p.sparse_bytes is None)
    comm = estimate.seconds(Collective.ALL_REDUCE, raw_bytes, world)
    compute = OPENING_COMPUTE_PER_FORWARD * forward_seconds
    ratio = comm / compute
    contention = planner.cost_model.contention_seconds_per_byte
    link = (
        f"{estimate.describe()}, transfers take {contention * 1e9:.3g} ns of compute per byte "
        f"sent (x{planner.cost_model.contention_rate():.2f} of the link's busy time)"
    )
    if ratio < planner.config.opening_ratio:
        logger.info(
            "autocomp: opening: %s; an uncompressed step would communicate %.3g s, %.1fx "
            "the estimated compute %.3g s; no decision before the first look",
            link,
            comm,
            ratio,
            compute,
        )
        return None
    if not planner.warmup_done:
        planner.warmup_done = True
        planner.guards.end_warmup(0)
    logger.info(
        "autocomp: opening: %s; an uncompressed step would communicate %.3g s, %.1fx the "
        "estimated compute %.3g s: deciding before step 0",
        link,
        comm,
        ratio,
        compute,
    )
    # Nothing is assumed hidden: no backward has been measured, and a plan chosen to hide
    # behind a guessed one (the target_overlap rule) ran 50% slower per step than
    # all-rank-4 on the GPT LM at 50 Mbit/s until the first window replaced it.
    timing = StepTiming(
        backward_seconds=compute - forward_seconds,
        hideable_seconds=0.0,
        step_seconds=compute + comm,
        compute_seconds=compute,
    )
    decision = planner.engine.decide(
        profiles,
        timing,
        0,
        world,
        pins=[*planner.operator_pins, *planner.pins],
        force_none=planner.force_none,
        current=current,
        warmup_done=True,
    )
    planner.last_decision = decision
    planner.opened = True
    specs = decision.plan
    plan = [specs[name] for name in planner.names]
    bandwidth = estimate.bandwidth_bytes_per_s
    start = warmup_start(planner, decision, profiles, timing, world, current)
    # No dwell clock starts here (nor hysteresis at the first measured look, see
    # ``WindowPlanner.decide``): this plan rests on priors and a guessed compute.
    record = WindowRecord.opening(
        float(raw_bytes),
        bandwidth_bytes_per_s=bandwidth,
        latency_s=estimate.latency_s,
        decision=decision.to_dict(),
        compute_seconds=compute,
    )
    start_plan = None
    if start is not None and record.decision is not None:
        start_plan = [start.plan[name] for name in planner.names]
        record.decision["start"] = {
            "plan": {n: s for n, s in start.plan.items() if s != specs[n]},
            "predicted_step_seconds": start.predicted_step_seconds,
        }
    return PlanUpdate(plan=plan, resets=[], probe_bytes=0, record=record, start_plan=start_plan)


def warmup_start(
    planner: WindowPlanner,
    decision: PolicyDecision,
    profiles: list[LayerProfile],
    timing: StepTiming,
    world: int,
    current: dict[str, str],
) -> PolicyDecision | None:
    """The plan step 0 runs before the opening's ``decision`` takes over, or None.

    The opening compresses before any gradient has crossed the link, so without this the
    very first update is computed from compressed gradients. Under Adam that update is
    about ``lr`` times the sign of each element's first gradient, whatever its size: a
    PowerSGD rank-4 approximation, warm start still random, gets most of those signs wrong,
    and the model pays for it long after. On the MLP LM (2 ranks, loopback, 3 seeds) step 0
    on PowerSGD rank 4 left the validation loss at 2.819 / 2.281 at steps 100 / 400, against
    2.771 / 2.264 with step 0 on int8 and 2.773 / 2.267 with it uncompressed, 16-18 steps
    of progress; the GPT LM (AdamW) showed no difference beyond its noise.

    So step 0 runs the warm-up's own plan (the options within the rules'
    ``warmup_max_error``, int8 and fp16 among the defaults, as the engine picks them in
    the warm-up) when it changes a layer and is predicted, by the same exposure model, to
    cost at most ``start_cost_steps`` of the opening plan's steps more than one of them.
    On a 2-rank 200 Mbit/s link int8 sends the MLP LM's 13.7 MB of gradients in about
    0.14 s, two or three compressed steps; at 10 Mbit/s it would take 2.8 s, 25 of them.
    Pinned layers keep their pin either way. Off with ``warmup_steps = 0`` (compression
    from step 0 was asked for) and under an operator's force-none.
    """
    budget = planner.config.start_cost_steps
    if budget <= 0 or planner.config.warmup_steps <= 0 or planner.force_none:
        return None
    planned = decision.predicted_step_seconds
    if not (math.isfinite(planned) and planned > 0):
        return None
    start = planner.engine.decide(
        profiles,
        timing,
        0,
        world,
        pins=[*planner.operator_pins, *planner.pins],
        current=current,
        warmup_done=False,
    )
    if start.plan == decision.plan:
        return None
    extra = start.predicted_step_seconds - planned
    moved = sum(1 for name in planner.names if start.plan[name] != decision.plan[name])
    if not extra <= budget * planned:
        logger.info(
            "autocomp: opening: step 0 compresses: the warm-up's plan for it (%d layers) "
            "predicts %.3g s, %.1f of the plan's %.3g s steps more, over start_cost_steps %g",
            moved,
            start.predicted_step_seconds,
            extra / planned,
            planned,
            budget,
        )
        return None
    logger.info(
        "autocomp: opening: step 0 runs the warm-up's plan on %d layers (predicted %.3g s, "
        "%.1f of the plan's %.3g s steps more); the plan takes over at step 1",
        moved,
        start.predicted_step_seconds,
        max(extra, 0.0) / planned,
        planned,
    )
    return start
