"""Measure one compressor on one gradient-shaped tensor: times, wire bytes and error.

The measuring half of ``autocomp-bench compressors`` (:mod:`autocomp_bench.compressors` runs
it and renders the report): gradient-like synthetic tensors (:func:`gradient_like`), the local
work the comm hook adds per layer replayed without the collective (:class:`Case`), and the
break-even bandwidth below which compressing that layer pays with 2 ranks.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from autocomp.compressors import (
    Collective,
    Compressor,
    NoCompression,
    PowerSGD,
    run_rounds_locally,
)

logger = logging.getLogger(__name__)

WORLD_SIZE = 2
"""Ranks assumed by the hook model and the break-even bandwidth."""
POWERSGD_WARMUP_STEPS = 8
"""PowerSGD steps run on the same tensor before its error is measured (warm start)."""
MB = 1e6
"""Bytes per MB in every per-MB figure (decimal, like Gbit/s)."""

GRADIENT = (
    "synthetic gradient-like tensors, viewed as (first dim) x (rest): 75% of the energy in a "
    "rank-32 component whose singular values decay as 1/i, 25% Student-t (3 d.o.f.) noise, "
    "rows and columns then scaled by log-normal (sigma=0.5) factors, overall RMS 1e-4 "
    "(the hook compresses the gradient after dividing it by the world size)"
)
MODEL = (
    "hook ms = local work the DDP hook adds for one layer in one step, collective excluded: "
    "copy to float32 and residual add, compress, for error-feedback compressors the local "
    "decompress and the residual subtraction, decoding what arrives (all-reduce: one summed "
    "payload; all-gather: 2 payloads, as with 2 ranks, via decompress_sum), the write-back "
    "copy and commit. For 'none' the hook does no extra work. Break-even bandwidth (2 ranks): "
    "a ring all-reduce sends 2(N-1)/N x B bytes per rank and an all-gather (N-1) x P, so with "
    "N=2 each rank sends (and receives) about one payload either way, and compressing saves "
    "(raw - wire) bytes per rank. It pays off when (raw - wire) * 8 / bw > hook time, i.e. "
    "below bw = (raw - wire) * 8 / hook_seconds, in Gbit/s (10^9 bit/s). The model ignores "
    "latency, overlap of communication with backward compute, the reduction arithmetic and "
    "the per-bucket concatenation of payloads."
)


# ---- inputs ----------------------------------------------------------------------------------

_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_shape(token: str) -> torch.Size:
    """``"1M"`` -> a near-square matrix of 2^20 elements; ``"256x256x3x3"`` -> that shape."""
    text = token.strip().lower()
    if not text:
        raise ValueError("empty size")
    if "x" in text:
        try:
            dims = [int(part) for part in text.split("x")]
        except ValueError:
            raise ValueError(f"bad shape {token!r}: expected e.g. 1024x4096") from None
        if any(d < 1 for d in dims):
            raise ValueError(f"bad shape {token!r}: every dimension must be >= 1")
        return torch.Size(dims)
    scale = _SUFFIXES.get(text[-1], 1)
    digits = text[:-1] if text[-1] in _SUFFIXES else text
    try:
        numel = int(float(digits) * scale)
    except ValueError:
        raise ValueError(f"bad size {token!r}: expected e.g. 1M, 4M, 65536 or 1024x4096") from None
    if numel < 1:
        raise ValueError(f"bad size {token!r}: must be at least one element")
    rows = 1 << (math.isqrt(numel).bit_length() - 1)  # largest power of two <= sqrt(numel)
    return torch.Size([rows, numel // rows])


def tensor_label(shape: torch.Size) -> str:
    kind = {2: "linear", 4: "conv"}.get(len(shape), "tensor")
    return f"{kind} {'x'.join(map(str, shape))}"


def gradient_like(shape: torch.Size, seed: int, *, rms: float = 1e-4) -> torch.Tensor:
    """A deterministic float32 tensor shaped and distributed roughly like a weight gradient.

    A linear layer's weight gradient is a sum of per-sample outer products, so it is close to
    low rank with a decaying spectrum; on top of that sit noisy, heavy-tailed entries and a few
    rows/columns (outlier features) much larger than the rest. See :data:`GRADIENT`.
    """
    numel = shape.numel()
    rows = shape[0] if len(shape) >= 2 else numel
    cols = numel // rows if rows else 0
    gen = torch.Generator().manual_seed(seed)
    rank = max(1, min(32, rows, cols))
    spectrum = 1.0 / torch.arange(1, rank + 1, dtype=torch.float32)
    low = (torch.randn(rows, rank, generator=gen) * spectrum) @ torch.randn(
        cols, rank, generator=gen
    ).T
    noise = torch.randn(rows, cols, generator=gen)
    chi2 = torch.zeros(rows, cols)
    for _ in range(3):
        chi2.add_(torch.randn(rows, cols, generator=gen).square_())
    noise.div_(chi2.div_(3).sqrt_().clamp_(min=1e-6))  # Student-t, 3 degrees of freedom
    x = low.mul_(math.sqrt(0.75) / low.norm()).add_(noise, alpha=math.sqrt(0.25) / noise.norm())
    x.mul_(torch.exp(0.5 * torch.randn(rows, 1, generator=gen)))
    x.mul_(torch.exp(0.5 * torch.randn(1, cols, generator=gen)))
    x.mul_(rms / x.square().mean().sqrt())
    return x.reshape(shape).contiguous()


# ---- measurement -----------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    """One (tensor, compressor) measurement; every time is a median over the repeats."""

    tensor: str
    shape: list[int]
    numel: int
    spec: str
    collective: str
    biased: bool
    error_feedback: bool
    raw_bytes: int
    wire_bytes: int
    """Bytes one rank sends per step (PowerSGD: both rounds, P and Q)."""
    ratio: float
    compress_ms: float
    decompress_ms: float
    """One payload decoded (for error-feedback compressors: the hook's local decompress)."""
    hook_ms: float
    hook_ms_min: float
    """Fastest timed step: a lower bound less sensitive to background load than the median."""
    compress_ms_per_mb: float
    decompress_ms_per_mb: float
    hook_ms_per_mb: float
    hook_parts_ms: dict[str, float]
    """Median of each part of the hook's work (see :data:`MODEL`); they need not add up."""
    samples: int
    rel_error: float
    rel_error_note: str
    break_even_gbps: float | None
    """None when compressing never saves wire bytes or costs nothing."""
    break_even_gbps_at_min: float | None
    """The same from ``hook_ms_min``: what a quiet machine would reach."""
    best_rank_rel_error: float | None = None
    """PowerSGD only: error of the truncated SVD of the same rank (the best any rank-r can do)."""
    wire_bytes_mismatches: list[str] = field(default_factory=list)
    """Steps whose payload size differed from ``wire_bytes`` (a compressor bug if non-empty)."""


_PARTS = ("prepare", "compress", "ef_decompress", "ef_subtract", "decode", "commit")


class _HookStep:
    """Replays the per-layer work of :mod:`autocomp.hook_layer` for one rank, minus the
    collective."""

    def __init__(self, compressor: Compressor, shape: torch.Size, seed: int) -> None:
        self.compressor = compressor
        self.shape = shape
        self.state = compressor.init_state(shape, seed, 0)
        self.residual: torch.Tensor | None = None
        self.identity = type(compressor) is NoCompression
        self.target = torch.empty(shape.numel(), dtype=torch.float32)
        self.mismatches: list[str] = []

    def run(self, grad: torch.Tensor, step: int) -> tuple[dict[str, float], float]:
        """One step; returns the hook's parts in seconds and a standalone decompress time."""
        c, shape, state = self.compressor, self.shape, self.state
        clock = time.perf_counter
        parts = dict.fromkeys(_PARTS, 0.0)
        expected = c.wire_bytes(shape, torch.float32)

        t0 = clock()
        if self.identity:
            x = grad
        else:
            x = grad.to(torch.float32, copy=True)
            if self.residual is not None:
                x.add_(self.residual)
        t1 = clock()
        payload = c.compress(x, state)
        sent = payload.numel() * payload.element_size()
        for index in range(1, c.rounds_for(shape)):
            # A later round starts from the previous round's sum over WORLD_SIZE ranks.
            payload = c.compress_round(x, index, payload * WORLD_SIZE, state)
            sent += payload.numel() * payload.element_size()
        t2 = clock()
        parts["prepare"], parts["compress"] = t1 - t0, t2 - t1

        decompress_s: float
        if c.error_feedback and not self.identity:
            t0 = clock()
            estimate = c.decompress(payload, shape, state)
            t1 = clock()
            self.residual = x.sub_(estimate)
            t2 = clock()
            parts["ef_decompress"], parts["ef_subtract"] = t1 - t0, t2 - t1
            decompress_s = parts["ef_decompress"]
        else:
            t0 = clock()
            c.decompress(payload, shape, state)
            decompress_s = clock() - t0

        if sent != expected:
            self.mismatches.append(f"step {step}: payload {sent} bytes, wire_bytes {expected}")

        # What the collective would deliver with WORLD_SIZE ranks (the other ranks' payloads
        # stood in by copies of this one): the sum for all-reduce, every payload for all-gather.
        received: torch.Tensor | list[torch.Tensor]
        if c.collective is Collective.ALL_REDUCE:
            received = payload * WORLD_SIZE
        else:
            received = [payload] + [payload.clone() for _ in range(WORLD_SIZE - 1)]

        t0 = clock()
        if isinstance(received, list):
            decoded = c.decompress_sum(received, shape, state)
        else:
            decoded = c.decompress(received, shape, state)
        if not self.identity:
            self.target.copy_(decoded.reshape(-1))
        t1 = clock()
        c.commit(received, state)
        t2 = clock()
        parts["decode"], parts["commit"] = t1 - t0, t2 - t1
        return parts, decompress_s


def relative_error(compressor: Compressor, x: torch.Tensor, seed: int) -> tuple[float, str]:
    """||decompress(compress(x)) - x|| / ||x|| for one step from fresh state (no residual)."""
    state = compressor.init_state(x.shape, seed, 0)
    note = "one step"
    if isinstance(compressor, PowerSGD) and compressor.compresses(x.shape):
        for _ in range(POWERSGD_WARMUP_STEPS):
            compressor.commit(run_rounds_locally(compressor, x, state), state)
        note = f"after {POWERSGD_WARMUP_STEPS} warm-up steps on the same tensor"
    estimate = compressor.decompress(run_rounds_locally(compressor, x, state), x.shape, state)
    err = torch.linalg.vector_norm(estimate.double() - x.double())
    norm = torch.linalg.vector_norm(x.double())
    return (float(err / norm) if norm > 0 else 0.0), note


def best_rank_error(singular_values: torch.Tensor, rank: int) -> float:
    """Relative Frobenius error of the best rank-``rank`` approximation (Eckart-Young)."""
    energy = singular_values.double().square()
    return float(energy[rank:].sum().div(energy.sum()).sqrt())


def break_even_gbps(raw_bytes: int, wire_bytes: int, hook_seconds: float) -> float | None:
    """Link bandwidth (Gbit/s) below which the wire time saved exceeds the hook time."""
    saved = raw_bytes - wire_bytes
    if saved <= 0 or hook_seconds <= 0:
        return None
    return saved * 8 / hook_seconds / 1e9


class Case:
    """One (tensor, compressor) pair: its hook replay and the timing samples collected so far."""

    def __init__(
        self,
        label: str,
        x: torch.Tensor,
        compressor: Compressor,
        seed: int,
        singular_values: torch.Tensor | None = None,
    ) -> None:
        self.label = label
        self.singular_values = singular_values
        self.x = x
        self.compressor = compressor
        self.seed = seed
        self.hook = _HookStep(compressor, x.shape, seed)
        self.steps = 0
        self.samples: list[tuple[dict[str, float], float]] = []

    def step(self, record: bool) -> None:
        with torch.no_grad():
            parts, decompress_s = self.hook.run(self.x, self.steps)
        self.steps += 1
        if record:
            self.samples.append((parts, decompress_s))

    def result(self) -> Result:
        """Summarize the samples (medians) and measure the relative error."""
        compressor, shape = self.compressor, self.x.shape
        if not self.samples:
            raise RuntimeError(f"no timed steps for {self.label} {compressor.spec}")
        with torch.no_grad():
            rel_error, note = relative_error(compressor, self.x, self.seed)

        def ms(values: Sequence[float]) -> float:
            return statistics.median(values) * 1e3

        parts = {k: ms([p[k] for p, _ in self.samples]) for k in _PARTS}
        totals = [sum(p.values()) for p, _ in self.samples]
        identity = self.hook.identity
        hook_ms = 0.0 if identity else ms(totals)
        decompress_ms = ms([d for _, d in self.samples])
        raw = shape.numel() * 4
        wire = compressor.wire_bytes(shape, torch.float32, None)
        mb = raw / MB
        best = None
        svd = self.singular_values
        if svd is not None and isinstance(compressor, PowerSGD) and compressor.compresses(shape):
            best = best_rank_error(svd, int(compressor.config["rank"]))
        return Result(
            tensor=self.label,
            shape=list(shape),
            numel=shape.numel(),
            spec=compressor.spec,
            collective=compressor.collective.value,
            biased=compressor.biased,
            error_feedback=compressor.error_feedback,
            raw_bytes=raw,
            wire_bytes=wire,
            ratio=raw / max(wire, 1),
            compress_ms=parts["compress"],
            decompress_ms=decompress_ms,
            hook_ms=hook_ms,
            hook_ms_min=0.0 if identity else min(totals) * 1e3,
            compress_ms_per_mb=parts["compress"] / mb,
            decompress_ms_per_mb=decompress_ms / mb,
            hook_ms_per_mb=hook_ms / mb,
            hook_parts_ms=parts,
            samples=len(self.samples),
            rel_error=rel_error,
            rel_error_note=note,
            break_even_gbps=break_even_gbps(raw, wire, hook_ms / 1e3),
            break_even_gbps_at_min=break_even_gbps(raw, wire, min(totals) if not identity else 0),
            best_rank_rel_error=best,
            wire_bytes_mismatches=self.hook.mismatches,
        )


def run_rounds(cases: list[Case], *, repeats: int, warmup: int) -> list[float]:
    """Step every case once per round, ``warmup`` untimed rounds then ``repeats`` timed ones.

    Interleaving the cases (rather than finishing one before the next) spreads any background
    load on a shared machine over all compressors instead of penalizing whichever ran at the
    wrong moment. Returns the wall time of each timed round in seconds.
    """
    durations: list[float] = []
    for round_index in range(warmup + repeats):
        record = round_index >= warmup
        started = time.perf_counter()
        for case in cases:
            case.step(record)
        elapsed = time.perf_counter() - started
        if record:
            durations.append(elapsed)
        logger.info(
            "round %d/%d (%s) took %.1f s",
            round_index + 1,
            warmup + repeats,
            "timed" if record else "warm-up",
            elapsed,
        )
    return durations
