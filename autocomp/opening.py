"""Before the first step's collectives: time the link, decide, and time the compressors here.

The adaptive loop's opening (:meth:`~autocomp.adaptive.AdaptiveLoop` at step 0) needs one
agreed reading of the link before any gradient has crossed it, so that a link far slower
than the backward is compressed from the first step (:func:`open_plan` decides, for
``WindowPlanner.open``). The
same timed all-reduce of a zero buffer serves the payoff check's and the link meter's probes
at later boundaries. Rank 0 also times each candidate compressor's real hook path once on the
gradients' device: the cost model's cold-start constants come from another, idle machine.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from autocomp.compressors import Collective, build_compressor
from autocomp.cost_model import HALF_DTYPES, CostModel
from autocomp.hook_layer import LayerReplay
from autocomp.link_model import latency_hops, link_bytes
from autocomp.link_probe import PROBE_OVERRUN_FACTOR, PROBE_OVERRUN_MIN_SECONDS, PROBE_PASSES
from autocomp.policy.types import LayerProfile, PolicyDecision, StepTiming
from autocomp.window import PlanUpdate, WindowRecord

if TYPE_CHECKING:
    from autocomp.planner import WindowPlanner

logger = logging.getLogger(__name__)

__all__ = [
    "CALIBRATION_SHAPE",
    "OPENING_FAST_MARGIN",
    "OPENING_PROBE_MAX_BYTES",
    "OPENING_PROBE_SECONDS",
    "OPENING_PROBE_START_BYTES",
    "EmbeddingRows",
    "OpeningProbe",
    "ProbeRunner",
    "calibrate",
    "calibration_shape_for",
    "gradient_device",
    "open_plan",
    "untraced",
    "warmup_start",
]

OPENING_PROBE_START_BYTES = 64 * 1024
"""First size of the opening's link probe (per-rank all-reduce payload)."""
OPENING_PROBE_MAX_BYTES = 32 * 1024 * 1024
"""Largest opening probe (and never more than the gradients themselves)."""
OPENING_PROBE_SECONDS = 0.02
"""An opening probe pass this much longer than the small all-reduce
(``LATENCY_PROBE_BYTES``) ends the growth: the transfer dwarfs the latency."""
OPENING_COMPUTE_PER_FORWARD = 3.0
"""The opening's compute estimate per second of the first forward (forward + a backward of
about twice its cost)."""
OPENING_FAST_MARGIN = 10.0
"""The probe stops growing once even its own pass's rate (latency included, so an upper
bound) puts the gradients' all-reduce this many times under the opening's threshold: a
larger pass could only read the link faster, and the opening would not act either way. On
loopback the n-gram model's probe grew to 32 MB and took 0.36 s of a 0.75 s opening."""
OPENING_STOP_PASSES = 2
"""Timed passes more at the size where the opening's probe would stop; the stop and the
reading rest on the least of all three (agreed like each round)."""
LATENCY_PROBE_BYTES = 4 * 1024
"""Per-rank payload of the opening's small all-reduces: the size of the small payloads a
compressed plan adds (PowerSGD's factors, a bucket's uncompressed leftovers). Their time is
the per-collective cost that the large probe cannot show."""
LATENCY_PROBE_PASSES = 7
"""Timed small all-reduces after a priming one; each rank reads their median."""
CALIBRATION_SHAPE = torch.Size([1024, 1024])
"""The gradient shape each candidate is timed on."""
LARGE_CALIBRATION_MIN_RATIO = 2
"""A model whose largest matrix has at least this many times ``CALIBRATION_SHAPE``'s
elements has its candidates timed on that matrix too (``calibrate``). Per element, fp16 cost
2.3x on 2M elements what it cost on 1M here, top-k 1.6x."""
LARGE_CALIBRATION_MAX_NUMEL = 1 << 24
"""The most elements the large calibration times (rows are cut to fit): past caches, the
cost per element stops growing (8.4M and 16.8M elements cost alike per element here), and
a 64 MB matrix per candidate is already a large share of the set-up."""
LARGE_CALIBRATION_CALLS = 2
"""Calls per candidate on the large shape; the faster counts (the first paid 3x on fp16 on
8.4M elements, its pages touched for the first time)."""
LARGE_CALIBRATION_SECONDS = 0.25
"""Budget of the large calibration at ``wrap``, rank 0. On the n-gram task's table it times
fp16 and PowerSGD ranks 4 and 16 (about 0.2 s) and leaves out int8 and top-k (0.7 and
0.45 s there), which are then priced at the median growth the others measured."""
CONTENTION_PAIRS = 7
"""Timed pairs (compute alone, compute beside a transfer) of the contention probe. Three
read 0-54 ns a byte over 15 repeats on one 50 Mbit/s link (one a 0, which prices every hidden
transfer as free), seven 10-45 with none (docs/benchmarks-history.md, twenty-second session)."""
CONTENTION_MIN_SLOWDOWN = 0.03
"""A median slowdown under this fraction of the compute alone reads as no contention."""
CONTENTION_SETTLED_SLOWDOWN = 2 * CONTENTION_MIN_SLOWDOWN
"""A reading whose slowdown is under this fraction of the compute alone is unsettled: it
sits within the noise cut's reach, and the adaptive loop takes it again once a layer is
compressed (``adaptive.CONTENTION_REREADS``). Repeated in a warm process, a 2-core pair's
probe at 50 Mbit/s read 14-36 ns a byte in 8 of 10 batches (its 30 ms loop slowed by 8-21%),
but one held-out 12-layer GPT opening in twelve read 7.8 ns a byte (about 4.5%), and its plan
then put four first-bucket matrices on fp16 where a reading of 25 ns a byte keeps three on
PowerSGD rank 4 (docs/benchmarks-history.md, twenty-seventh and twenty-eighth sessions)."""
CONTENTION_BATCHES = 2
"""Batches of ``CONTENTION_PAIRS`` at most. When every rank's first batch reads no contention,
another is timed and all pairs are judged together. One rank of a 2-core 50 Mbit/s pair read
under the cut in 4 of 12 batches and 17-28 ns a byte in the rest (the transfer's CPU work
lands on one core or the other for a while), and when both ranks read under it the opening
priced every hidden transfer as free: on the held-out 12-layer GPT that put five first-bucket
matrices uncompressed where any reading from 10 ns a byte up kept one (docs/benchmarks-history.md,
twenty-seventh session)."""
CONTENTION_SECONDS = (0.01, 0.03)
"""Bounds of the contention probe's compute per pass (it is sized like the transfer)."""
HALF_SUM_MAX_LINK_SECONDS_PER_ELEMENT = 50e-9
"""A float32 probe slower than this per element is a link too slow for the sum of halves to
count: half its time is 25 ns an element, and a sum 20% over that (5 ns) is 4-5x what gloo's
CPU sum of halves costs beyond its bytes here (0.94-1.13 ns). About 640 Mbit/s for 2 ranks."""
HALF_SUM_PROBE_ELEMENTS = 1 << 19
"""Elements summed by the sums-of-halves probe (2 MB of float32), or the gradients' count if
smaller. The opening's own probe often stops at 64 KB on a fast link, where 1-2 ns an element
is 16-32 us, under the timing's jitter: on a 1 Gbit/s tbf link 16K-element passes read
float16 at 10-210 ns an element beyond its bytes, and the policy priced fp16 above sending
nothing (GPT LM, 2026-11-27). At 512K elements a 20% excess is about 0.15 ms on loopback."""
HALF_SUM_PROBE_SECONDS = 0.01
"""Bound on the sums-of-halves probe's float32 pass, at the opening probe's rate: fewer
elements on a slower link, so that the probe's 12 passes stay under about 80 ms (at 1 Gbit/s a
float32 pass of 1M elements, the opening probe's size there, took 34 ms). The opening probe's
rate includes its latency, so on a fast link it understates what fits: at 5 ms, loopback's
64 KB probe (20 ns an element) cut the sums to 240K elements and bfloat16 read up to 7 ns.
At the slowest link timed (about 640 Mbit/s: 200K elements) a 20% excess is still 1 ms."""
HALF_SUM_ROUNDS = 5
"""Timed rounds of the sums-of-halves probe, after a priming pass of each type. Each round
times float32 and then every half type; a half's excess is its least over the rounds, so that
one pass that met an empty token bucket or a descheduled peer does not read as a CPU cost.
Three rounds read float16 as free in 7 of 100 probes on loopback (its excess is 1.5-1.7 ns an
element there), where every float32 pass had met a slow moment. Five read it free in 2 of
100, seven in 0 of 60, for 36, 54 and 67 ms a probe (the n-gram model's size, each after the
contention probe as in the opening). That zero priced fp16 on the n-gram table below
``none`` and let a warm-up look end on it (thirty-eighth session)."""


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


@dataclass(frozen=True, slots=True)
class OpeningProbe:
    """What every rank agreed on at the opening."""

    payload_bytes: int
    """Per-rank all-reduce payload of the timed pass."""
    seconds: float
    """The fastest rank's timed pass (the rank that arrived last did not wait)."""
    slowest_forward_seconds: float
    """The slowest rank's first training forward."""
    forward_missing: bool
    """A rank had no forward time (then the opening decides nothing)."""
    contention_seconds_per_byte: float = 0.0
    """The most any rank's compute slowed per byte it sent beside it
    (:meth:`ProbeRunner.contention`)."""
    contention_settled: bool = True
    """Some rank's slowdown reached ``CONTENTION_SETTLED_SLOWDOWN`` (false: the reading may
    come from a quiet moment)."""
    half_sum_seconds_per_element: tuple[float, ...] = (0.0, 0.0)
    """Per type of ``cost_model.HALF_DTYPES`` (float16, bfloat16): what an all-reduce of
    half-precision elements costs per element beyond its bytes
    (:meth:`ProbeRunner.half_sums`)."""
    latency_probe: tuple[int, float] | None = None
    """(per-rank payload bytes, seconds) of the agreed small all-reduce
    (:meth:`ProbeRunner.small_all_reduce`), or None where the probe's pass did not take
    ``OPENING_PROBE_SECONDS`` more than it (the two cannot be told apart) or the small pass
    was faster per byte (a shaper's burst: ``_latency_reading``)."""


def _agreed_round(
    seconds: float,
    forward_seconds: float | None,
    device: torch.device,
    group: dist.ProcessGroup | None,
    node: dist.ProcessGroup | None,
) -> tuple[float, float, bool]:
    """One round of the opening's growth, agreed on every rank: (the pass's least over
    ``group``, then its most over ``node``; the slowest forward; whether a rank had none).

    Under a hierarchy the group's fastest pass (skew-free) is its flow's time, and the
    node's link is busy until its slowest flow ends."""
    # MAX of -seconds is the minimum; a rank without a forward time vetoes (-1 < 0).
    agreed = torch.tensor(
        [
            -seconds,
            -1.0 if forward_seconds is None else forward_seconds,
            1.0 if forward_seconds is None else 0.0,
        ],
        dtype=torch.float64,
    ).to(device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
    if node is not None:
        agreed[0] = -agreed[0]
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=node)
        agreed[0] = -agreed[0]
    negated, slowest_forward, missing = agreed.cpu().tolist()
    return -negated, slowest_forward, missing != 0.0


def _opening_probe_stops(
    least: float,
    *,
    small: float,
    size: int,
    cap: int,
    raw_bytes: int,
    opening_ratio: float | None,
    slowest_forward: float,
) -> bool:
    """Whether the opening's probe stops growing at ``size`` with an agreed pass of
    ``least`` seconds: the pass took ``OPENING_PROBE_SECONDS`` beyond the small all-reduce,
    the probe reached ``cap``, or (given ``opening_ratio``) the link is plainly fast
    (``OPENING_FAST_MARGIN``; time grows at most in proportion to the bytes, so the pass's
    rate bounds the gradients' all-reduce from above)."""
    if least >= OPENING_PROBE_SECONDS + small or size >= cap:
        return True
    return (
        opening_ratio is not None
        and slowest_forward > 0
        and least * raw_bytes / size
        < opening_ratio * OPENING_COMPUTE_PER_FORWARD * slowest_forward / OPENING_FAST_MARGIN
    )


def _latency_reading(
    small_seconds: float, probe_bytes: int, probe_seconds: float
) -> tuple[int, float] | None:
    """The small all-reduce as the opening's second size, where the two passes can give the
    link model a latency at all; else None, and the latency stays a prior.

    Two conditions. The probe's pass must take ``OPENING_PROBE_SECONDS`` more than the small
    one, or its bytes' time is not resolvable beside it: a probe capped at a small model's
    gradients can take a few ms, inside a shaper's token bucket, and a 0.3-4 ms small pass
    beside it made a 100 Mbit/s link read 303 (digits ResNet, fifty-seventh session). And
    the small pass must not be faster per byte than the probe's: then it ran in a regime of
    its own (a token bucket's burst at line rate, the probe's pass at the sustained rate),
    the line through the two has a negative latency, and the meter's non-negative fit bends
    toward the small point. At 10 Mbit/s a 4 KB pass in 0.5 ms beside a 64 KB one in 56 ms
    read the link as 49-82 Mbit/s; the step-100 probe sized at that reading took 3.5 s of a
    30 s run of the digits CNN (the full matrix at a7f3f87, fifty-eighth session)."""
    if not (small_seconds > 0 and probe_seconds - small_seconds >= OPENING_PROBE_SECONDS):
        return None
    if small_seconds * probe_bytes < probe_seconds * LATENCY_PROBE_BYTES:
        return None
    return (LATENCY_PROBE_BYTES, small_seconds)


def _compute_seconds(matrix: torch.Tensor, reps: int) -> float:
    """Seconds ``reps`` products of ``matrix`` with itself take: the contention probe's
    compute (a module function, so tests can script it)."""
    if matrix.is_cuda:
        torch.cuda.synchronize(matrix.device)
    started = time.perf_counter()
    for _ in range(reps):
        torch.mm(matrix, matrix)
    if matrix.is_cuda:
        torch.cuda.synchronize(matrix.device)
    return time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class ContentionReading:
    """What :meth:`ProbeRunner.contention` agreed on every rank."""

    seconds_per_byte: float
    """Compute seconds a transfer took per byte sent: the most any rank measured."""
    slowdown: float
    """The largest median slowdown any rank measured, as a fraction of its quiet loop."""

    @property
    def settled(self) -> bool:
        """A reading clear of the noise cut (``CONTENTION_SETTLED_SLOWDOWN``)."""
        return self.seconds_per_byte > 0.0 and self.slowdown >= CONTENTION_SETTLED_SLOWDOWN


def _contention_reading(
    alone: Sequence[float], beside: Sequence[float], sent: float, transfer_seconds: float
) -> tuple[float, float]:
    """(compute seconds per byte sent that a transfer took from the timed loops beside it,
    the slowdown as a fraction of the quiet loop), from the medians of ``alone`` and
    ``beside``; the first is 0 under ``CONTENTION_MIN_SLOWDOWN``."""
    quiet, busy = statistics.median(alone), statistics.median(beside)
    overlapped = sent * min(1.0, busy / transfer_seconds) if transfer_seconds > 0 else 0.0
    slowdown = busy - quiet
    share = max(0.0, slowdown / quiet) if quiet > 0 else 0.0
    if overlapped > 0 and slowdown > CONTENTION_MIN_SLOWDOWN * quiet:
        return slowdown / overlapped, share
    return 0.0, share


class ProbeRunner:
    """Timed all-reduces of one reused zero buffer (the sums stay zero)."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self.last_contention_seconds: float | None = None
        """Wall time of this rank's last :meth:`contention` probe, both batches and their
        agreements (the adaptive loop rations its re-reads by it)."""

    def time_all_reduce(
        self, payload_bytes: int, device: torch.device, group: dist.ProcessGroup | None
    ) -> float:
        """Seconds of the last of ``PROBE_PASSES`` all-reduces (the first primes the path)."""
        return _timed_all_reduce(self._view(payload_bytes, device), group)

    def fastest_all_reduce(
        self,
        payload_bytes: int,
        device: torch.device,
        group: dist.ProcessGroup | None,
        timed: int,
        expected_pass_seconds: float | None = None,
    ) -> float:
        """Seconds of the fastest of ``timed`` all-reduces after a priming one: what the link
        can do, with a scheduling hiccup of this rank's (one pass in three on 4 ranks of 2
        cores read loopback 10x slow) left out.

        Given ``expected_pass_seconds`` (a pass at the estimate the probe was sized on), the
        ranks agree on the priming pass (its least over ``group``, one small all-reduce), and
        where even that overran the expectation (``PROBE_OVERRUN_FACTOR``) every rank stops
        and returns its priming pass: the link is far slower than the estimate."""
        view = self._view(payload_bytes, device)
        priming = _pass_seconds(view, group)
        if expected_pass_seconds is not None:
            (least,) = _agreed_least([priming], device, group, None)
            overrun = max(PROBE_OVERRUN_FACTOR * expected_pass_seconds, PROBE_OVERRUN_MIN_SECONDS)
            if least > overrun:
                return priming
        return min(_pass_seconds(view, group) for _ in range(max(1, timed)))

    def _timed_passes(
        self, payload_bytes: int, device: torch.device, group: dist.ProcessGroup | None, timed: int
    ) -> list[float]:
        """Seconds of each of ``timed`` all-reduces of ``payload_bytes``, after an untimed
        priming one (allocations, a shaper's bucket drained)."""
        view = self._view(payload_bytes, device)
        _pass_seconds(view, group)
        return [_pass_seconds(view, group) for _ in range(max(1, timed))]

    def _view(self, payload_bytes: int, device: torch.device) -> torch.Tensor:
        """The reused zero buffer's first ``payload_bytes`` (float32), grown when needed."""
        numel = max(1, payload_bytes // 4)
        buffer = self._buffer
        if buffer is None or buffer.numel() < numel or buffer.device != device:
            buffer = torch.zeros(numel, dtype=torch.float32, device=device)
            self._buffer = buffer
        return buffer[:numel]

    def opening(
        self,
        raw_bytes: int,
        forward_seconds: float | None,
        device: torch.device,
        group: dist.ProcessGroup | None,
        opening_ratio: float | None = None,
        node: dist.ProcessGroup | None = None,
    ) -> OpeningProbe:
        """Time a small all-reduce (:meth:`small_all_reduce`: the latency), then grow the
        probe from ``OPENING_PROBE_START_BYTES`` by 4x until a timed pass takes
        ``OPENING_PROBE_SECONDS`` more than the small one (latency is then a rounding error in
        its rate) or it reaches the
        gradients' size (``raw_bytes``): a 64 KB pass reads a 10 Mbit/s link in 50 ms, and a
        loopback link gets a few quick passes. Every rank agrees on each round through one
        small all-reduce, so all stop at the same size.

        ``opening_ratio``: the communication-to-compute ratio at which the opening decides
        (``WindowPlanner.Config.opening_ratio``). Given it, the growth also stops once the
        link is plainly fast (``OPENING_FAST_MARGIN``).

        ``node``: with a hierarchy, ``group`` is this rank's cross-node group, one of the L
        that share the node's link, and ``node`` the ranks of this rank's node. Each round's
        agreement then also takes the node's MAX of its groups' figures, so that every group
        grows and stops in step and the node's reading is its slowest flow: the L groups
        probe the one link together, as the hook's owners send. Agreed within each group
        alone, the groups stopped at different rounds (two nodes of two ranks, LSTM LM,
        2026-11-26: one group at 64 KB, the other at 256 KB, each with its own forward
        time), and rank 0 read its own group's flow as the node's."""
        cap = max(OPENING_PROBE_START_BYTES, min(raw_bytes, OPENING_PROBE_MAX_BYTES))
        size = OPENING_PROBE_START_BYTES
        # First, so that the probe grows until its bytes, not the latency, take
        # OPENING_PROBE_SECONDS: on a link with a 20 ms round trip a 64 KB pass takes 40 ms
        # and was read as 13 Mbit/s whatever the rate.
        small = self.small_all_reduce(device, group, node)
        while True:
            least, slowest_forward, missing = _agreed_round(
                self.time_all_reduce(size, device, group), forward_seconds, device, group, node
            )
            stops = partial(
                _opening_probe_stops,
                small=small,
                size=size,
                cap=cap,
                raw_bytes=raw_bytes,
                opening_ratio=None if missing else opening_ratio,
                slowest_forward=slowest_forward,
            )
            if stops(least):
                # One timed pass is one moment: a burst of other load on a shared machine
                # read loopback as 14.7 Mbit/s and stopped the growth at 64 KB (the digits
                # CNN, fifty-eighth session's matrix). The stop stands on the least of
                # ``OPENING_STOP_PASSES`` more, agreed like the first (least over the group,
                # most over the node).
                view = self._view(size, device)
                again = min(_pass_seconds(view, group) for _ in range(OPENING_STOP_PASSES))
                least = min(least, *_agreed_least([again], device, group, node))
            if stops(least):
                contention = self.contention(size, least, device, group, node)
                halves = self.half_sums(size, least, device, group, node, gradient_bytes=raw_bytes)
                return OpeningProbe(
                    size,
                    least,
                    slowest_forward,
                    missing,
                    contention.seconds_per_byte,
                    contention.settled,
                    halves,
                    _latency_reading(small, size, least),
                )
            size = min(cap, size * 4)

    def small_all_reduce(
        self,
        device: torch.device,
        group: dist.ProcessGroup | None,
        node: dist.ProcessGroup | None = None,
    ) -> float:
        """Seconds of a ``LATENCY_PROBE_BYTES`` all-reduce, agreed like the probe (the least
        over ``group``, the most over ``node``): each rank's median of
        ``LATENCY_PROBE_PASSES`` after a priming one.

        The opening's probe grows until latency is a rounding error in it, so the link
        model's per-hop latency stayed at its 50 us prior in every run: the hook's own
        collectives are too alike in size to fit it (``BandwidthMeter``). On a link with a
        real round trip that mispriced every collective a plan adds. The median, not the
        least: a collective in a step pays the typical hand-off, not the best one. Taken
        idle, this still reads less than a step pays on a busy CPU: on this project's 2-core
        machine the latency fitted on it came to 0-0.3 ms a collective, while the second
        and third collectives of a PowerSGD step took 0.6-1.4 ms each, and a plan with three
        collectives a step was predicted 4 ms faster than fp16's one and measured 3 ms
        slower (digits ResNet at 100 Mbit/s, fifty-seventh session)."""
        passes = self._timed_passes(LATENCY_PROBE_BYTES, device, group, LATENCY_PROBE_PASSES)
        (agreed,) = _agreed_least([statistics.median(passes)], device, group, node)
        return agreed if math.isfinite(agreed) and agreed > 0 else 0.0

    def contention(
        self,
        payload_bytes: int,
        transfer_seconds: float,
        device: torch.device,
        group: dist.ProcessGroup | None,
        node: dist.ProcessGroup | None = None,
    ) -> ContentionReading:
        """Compute seconds a transfer takes from this machine's compute, per byte a rank sends:
        the most any rank measured, agreed through one all-reduce with the largest slowdown.

        A transfer is not free for the compute beside it. On CPU the sockets, copies and
        gloo's threads run on the backward's cores: on 2 cores a hidden 300 kB all-gather at
        50 Mbit/s stretched the GPT LM's backward by ~20 ms, and a plan the exposure model
        called as fast as all-PowerSGD measured 16% slower per step. So every rank times a
        matrix-product loop as long as the probe's transfer, alone and beside the probe's
        all-reduce, ``CONTENTION_PAIRS`` times; the median slowdown over the bytes sent
        while it ran is the contention. A slowdown under ``CONTENTION_MIN_SLOWDOWN`` reads as
        none (the noise of a shared machine). When every rank reads none, up to
        ``CONTENTION_BATCHES`` batches are timed and judged together: a zero prices every
        hidden transfer as free, so it must not rest on one batch that met a quiet moment.
        Every rank sees the same agreed reading after each batch, so all time the same
        batches and issue the same collectives. On a GPU the loop is a CUDA kernel, so the
        same probe measures what NCCL's kernels take from it.
        """
        started = time.perf_counter()
        side = 256 if device.type == "cpu" else 2048
        generator = torch.Generator().manual_seed(0)  # leaves the training RNG alone
        matrix = torch.randn(side, side, generator=generator).to(device)
        _compute_seconds(matrix, 2)  # warm the kernel
        one = max(_compute_seconds(matrix, 4) / 4, 1e-6)
        low, high = CONTENTION_SECONDS
        reps = max(1, round(min(high, max(low, transfer_seconds)) / one))
        # The opening's last probe pass just ran at this size: the path is primed.
        view = self._view(payload_bytes, device)
        sent = link_bytes(Collective.ALL_REDUCE, payload_bytes, dist.get_world_size(group))
        alone: list[float] = []
        beside: list[float] = []
        reading = ContentionReading(0.0, 0.0)
        for _ in range(CONTENTION_BATCHES):
            for _ in range(CONTENTION_PAIRS):
                alone.append(_compute_seconds(matrix, reps))
                work = dist.all_reduce(view, group=group, async_op=True)
                beside.append(_compute_seconds(matrix, reps))
                work.wait()
            local = _contention_reading(alone, beside, sent, transfer_seconds)
            agreed = torch.tensor(local, dtype=torch.float64).to(device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
            if node is not None:
                dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=node)
            per_byte, slowdown = agreed.cpu().tolist()
            reading = ContentionReading(per_byte, slowdown)
            if per_byte > 0.0:
                break
        self.last_contention_seconds = time.perf_counter() - started
        return reading

    def half_sums(
        self,
        payload_bytes: int,
        float_seconds: float,
        device: torch.device,
        group: dist.ProcessGroup | None,
        node: dist.ProcessGroup | None = None,
        gradient_bytes: int = 0,
    ) -> tuple[float, ...]:
        """Per type of ``cost_model.HALF_DTYPES`` (float16, bfloat16): seconds per element an
        all-reduce of halves costs beyond half of a float32 one, agreed as the fastest
        rank's (like the probe).

        The link model prices an all-reduce by its bytes, but gloo sums on the CPU, and it
        sums halves slowly: on loopback the n-gram table's 8.5M elements took 25.9 ms in
        float32, 23.2 ms in float16 and 18.7 ms in bfloat16, where bytes alone say 13 ms.
        The policy then put the table on fp16, predicted 5.5% faster, and it measured 7%
        slower. The probe sums ``HALF_SUM_PROBE_ELEMENTS`` (or ``gradient_bytes``' count if
        smaller, or what a float32 pass moves in ``HALF_SUM_PROBE_SECONDS`` at the opening
        probe's rate if that is fewer) in float32 and in each half type,
        ``HALF_SUM_ROUNDS`` times, and compares each type's fastest pass: a pass only ever
        takes longer than the link and the sum need (an empty token bucket, a descheduled
        peer), so each type's fastest is its least disturbed. (Comparing each half with the
        float32 pass just before it, the least excess over the rounds, read fp16 as free in
        4 of 8 openings on loopback, where it costs 0.9-3.2 ns an element: one slow float32
        pass beside a fast half made that round's excess negative.) A half that costs under
        20% more than its bytes reads as 0 (noise), and so does every GPU (NCCL sums halves
        on the device at bandwidth). Not timed on a link slower than
        ``HALF_SUM_MAX_LINK_SECONDS_PER_ELEMENT`` (by the opening probe's ``payload_bytes``
        and ``float_seconds``), where it would read 0: its transfers would cost a large
        part of the first step at 10-200 Mbit/s. Every rank has the same float time
        (agreed), so all skip alike. The probe's own first float32 pass, after a prime of
        its size, is agreed and judged the same way before any half is sent
        (:func:`_sum_link_too_slow`): the opening's pass can ride a shaper's bucket.
        """
        probe_numel = max(1, payload_bytes // 4)
        slow_link = float_seconds > HALF_SUM_MAX_LINK_SECONDS_PER_ELEMENT * probe_numel
        if device.type != "cpu" or float_seconds <= 0 or slow_link:
            return (0.0,) * len(HALF_DTYPES)
        wanted = HALF_SUM_PROBE_ELEMENTS
        if gradient_bytes > 0:
            wanted = min(wanted, gradient_bytes // 4)
        affordable = int(HALF_SUM_PROBE_SECONDS * probe_numel / float_seconds)
        numel = max(1, min(wanted, affordable))
        whole = self._view(numel * 4, device)
        _pass_seconds(whole, group)  # primes the path (and drains a shaper's bucket)
        first_whole = _pass_seconds(whole, group)
        # The opening's pass may have ridden a shaper's bucket (see _sum_link_too_slow): this
        # float32 pass, after a prime of the same size, reads the link itself.
        if _sum_link_too_slow(first_whole, numel, device, group, node):
            return (0.0,) * len(HALF_DTYPES)
        halves = [torch.zeros(numel, dtype=dtype, device=device) for dtype in HALF_DTYPES]
        for tensor in halves:
            _pass_seconds(tensor, group)  # primes each half type's path
        fastest_whole = first_whole
        fastest_half = [math.inf] * len(HALF_DTYPES)
        for round_index in range(HALF_SUM_ROUNDS):  # interleaved: a slow moment hits every type
            if round_index > 0:
                fastest_whole = min(fastest_whole, _pass_seconds(whole, group))
            for index, tensor in enumerate(halves):
                fastest_half[index] = min(fastest_half[index], _pass_seconds(tensor, group))
        excess = [half - fastest_whole / 2 for half in fastest_half]
        whole_seconds, *extras = _agreed_least([fastest_whole, *excess], device, group, node)
        bytes_only = whole_seconds / 2
        return tuple(e / numel if e > 0.2 * bytes_only else 0.0 for e in extras)


def _agreed_least(
    values: Sequence[float],
    device: torch.device,
    group: dist.ProcessGroup | None,
    node: dist.ProcessGroup | None,
) -> list[float]:
    """Each figure's least over ``group`` (the fastest rank's pass is skew-free), then its
    most over ``node`` (the node's slowest flow, as for the opening's float32 probe)."""
    agreed = torch.tensor([-v for v in values], dtype=torch.float64).to(device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)  # MAX of negated: the least
    if node is not None:
        agreed = -agreed
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=node)
        agreed = -agreed
    return (-agreed).cpu().tolist()


def _sum_link_too_slow(
    float_seconds: float,
    numel: int,
    device: torch.device,
    group: dist.ProcessGroup | None,
    node: dist.ProcessGroup | None,
) -> bool:
    """Whether the agreed float32 pass of ``numel`` elements is slower than
    ``HALF_SUM_MAX_LINK_SECONDS_PER_ELEMENT``: a link too slow for the sum of halves to count.

    The opening's probe stops growing at 64 KB once it reads the link as plainly fast, and a
    token-bucket shaper lets that much through at line rate: on a 500 Mbit/s tbf link (a
    250 kB bucket) the 64 KB pass read 1.2-1.45 Gbit/s in 3 of 4 openings, so the sums of
    halves were timed there, sized for that rate, and took 0.22-0.31 s of step 0 to read
    zeros (lstm-lm, forty-seventh session). One agreement after the first float32 pass
    stops them; on loopback it costs an 8-byte all-reduce."""
    (least,) = _agreed_least([float_seconds], device, group, node)
    return least > HALF_SUM_MAX_LINK_SECONDS_PER_ELEMENT * numel


def _pass_seconds(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> float:
    """Seconds of one all-reduce of ``tensor`` (device time on CUDA)."""
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
    started = time.perf_counter()
    dist.all_reduce(tensor, group=group)
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
    return time.perf_counter() - started


def _timed_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> float:
    """Seconds of the last of ``PROBE_PASSES`` all-reduces of ``tensor`` (the first primes
    the path)."""
    seconds = math.inf
    for _ in range(PROBE_PASSES):
        seconds = _pass_seconds(tensor, group)
    return seconds


def gradient_device(ddp: torch.nn.Module | None) -> torch.device:
    """Where the gradients live: the profiler's clock and the calibration follow it."""
    if ddp is not None:
        for param in ddp.parameters():
            return param.device
    return torch.device("cpu")


def calibration_shape_for(shapes: Sequence[torch.Size]) -> torch.Size | None:
    """The second size :func:`calibrate` times, from the wrapped gradients' ``shapes``: the
    largest matrix's shape (rows cut to stay within ``LARGE_CALIBRATION_MAX_NUMEL``), or None
    when no matrix has ``LARGE_CALIBRATION_MIN_RATIO`` times ``CALIBRATION_SHAPE``'s elements."""
    matrices = [torch.Size(shape) for shape in shapes if len(shape) >= 2 and shape.numel() > 0]
    if not matrices:
        return None
    largest = max(matrices, key=lambda shape: shape.numel())
    if largest.numel() < LARGE_CALIBRATION_MIN_RATIO * CALIBRATION_SHAPE.numel():
        return None
    columns = math.prod(largest[1:])
    rows = min(largest[0], max(1, LARGE_CALIBRATION_MAX_NUMEL // columns))
    return torch.Size([rows, *largest[1:]])


def _replay_seconds(compressor: Any, grad: torch.Tensor, world_size: int, calls: int) -> float:
    """The fastest of ``calls`` replays of the hook's work on ``grad`` (the first call pays
    one-off costs: allocations, first touches)."""
    replay = LayerReplay(compressor, grad, gathered=world_size)
    gathered = compressor.collective is Collective.ALL_GATHER
    best = math.inf
    for _ in range(calls):
        local, decode = replay.step()
        best = min(best, local + decode * (world_size if gathered else 1))
    return best


def calibrate(
    cost_model: CostModel,
    specs: Sequence[str],
    world_size: int,
    device: torch.device,
    large_shape: torch.Size | None = None,
    budget_seconds: float = LARGE_CALIBRATION_SECONDS,
) -> list[str]:
    """Time each candidate's real hook path here, on the gradients' device, at the training
    thread count; returns the specs also timed on ``large_shape``.

    The cost model's cold-start constants come from another machine and an idle one; without
    this the first decisions try compressors that do not pay, one window each. Each candidate
    is timed on ``CALIBRATION_SHAPE`` (1M elements), on rank 0 only, about 0.1 s on a 2-core
    CPU.

    ``large_shape`` (:func:`calibration_shape_for`): the model's largest matrix, where a
    price per element from 1M elements runs low. On the n-gram task's 131072 x 64 table the
    calibrated prior priced fp16 at 4.5-6.0 ms a step and int8 at 48 ms, where the hook
    measured 15 and 353 ms in training (2 ranks on 2 cores), and the policy put the table on
    fp16 on loopback. Each candidate is timed there too, cheapest first, while the estimate
    of its two calls (its 1M time scaled by the elements and by the largest growth per
    element seen so far) fits in what is left of ``budget_seconds``. A candidate left out is
    priced on that shape at the median growth per element measured there (with none
    measured, its 1M factor holds at every size).
    """
    generator = torch.Generator().manual_seed(0)
    grad = (torch.randn(CALIBRATION_SHAPE, generator=generator) * 1e-3).to(device)
    timed: list[tuple[float, Any]] = []
    for spec in specs:
        compressor = build_compressor(spec)
        if compressor.name == "none":
            continue
        best = _replay_seconds(compressor, grad, world_size, calls=3)
        factor = cost_model.calibrate(compressor, CALIBRATION_SHAPE, best)
        timed.append((best, compressor))
        logger.debug(
            "autocomp: %s costs %.2f ms per 1M elements here (x%.2f prior)",
            compressor.spec,
            best * 1e3,
            factor,
        )
    if large_shape is None or not timed:
        return []
    del grad
    large = (torch.randn(large_shape, generator=generator) * 1e-3).to(device)
    elements = large_shape.numel() / CALIBRATION_SHAPE.numel()
    growths: list[float] = []  # per candidate timed: its cost per element over its 1M one
    started = time.perf_counter()
    done: list[str] = []
    left_out: list[tuple[float, Any]] = []
    for small, compressor in sorted(timed, key=lambda item: item[0]):
        estimate = LARGE_CALIBRATION_CALLS * small * elements * max([1.0, *growths])
        if time.perf_counter() - started + estimate > budget_seconds:
            left_out.append((small, compressor))
            continue
        seconds = _replay_seconds(compressor, large, world_size, calls=LARGE_CALIBRATION_CALLS)
        growths.append(seconds / (small * elements))
        factor = cost_model.calibrate(compressor, large_shape, seconds)
        done.append(compressor.spec)
        logger.debug(
            "autocomp: %s costs %.2f ms on %s here, %.2fx its cost per element on 1M (x%.2f prior)",
            compressor.spec,
            seconds * 1e3,
            tuple(large_shape),
            seconds / (small * elements),
            factor,
        )
    typical = statistics.median(growths) if growths else 1.0
    for small, compressor in left_out if growths else []:
        # Not timed: priced at the median growth per element measured on this shape (on the
        # n-gram table fp16 grew 1.7-2.0x, PowerSGD rank 4 1.2x, rank 16 1.75x; top-k, left
        # out, 2.25x dense). At its 1M cost per element instead, top-k on that table's 0.56%
        # of nonzero rows was priced at 38 ms against none's 42 ms, where training measured
        # 62 ms, and the look at step 1 put the table on top-k on loopback.
        factor = cost_model.calibrate(compressor, large_shape, small * elements * typical)
        logger.debug(
            "autocomp: %s not timed on %s (over the calibration budget); priced at %.2fx its "
            "cost per element on 1M (x%.2f prior)",
            compressor.spec,
            tuple(large_shape),
            typical,
            factor,
        )
    return done


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
