"""Timed collectives on the link: what the adaptive loop knows of the link before any gradient
has crossed it, and the passes its boundary probes time.

:class:`ProbeRunner` times all-reduces of one reused zero buffer (the sums stay zero). At the
opening it grows a probe until the link's rate shows, times a small all-reduce for the
latency, a compute loop alone and beside a transfer (what a transfer takes from the cores
beside it) and the sums of 16-bit types (what gloo's CPU sum costs beyond their bytes); every
rank agrees on each reading through one small all-reduce, so all issue the same collectives.
At later boundaries it times the rationed link probe (:mod:`autocomp.link_probe` decides its
size and schedule), and the offline advisor and the two-level probe reuse it. What the
readings decide is :mod:`autocomp.opening`'s.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from autocomp.compressors import Collective
from autocomp.cost_model import HALF_DTYPES
from autocomp.link_model import link_bytes
from autocomp.link_probe import PROBE_OVERRUN_FACTOR, PROBE_OVERRUN_MIN_SECONDS, PROBE_PASSES

__all__ = [
    "CONTENTION_PAIRS",
    "LATENCY_PROBE_BYTES",
    "OPENING_COMPUTE_PER_FORWARD",
    "OPENING_FAST_MARGIN",
    "OPENING_PROBE_MAX_BYTES",
    "OPENING_PROBE_SECONDS",
    "OPENING_PROBE_START_BYTES",
    "ContentionReading",
    "OpeningProbe",
    "ProbeRunner",
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
