"""Compute cost of every compressor on this machine, with the bandwidth where it starts to pay.

Run as::

    python -m autocomp.bench.compressors [--sizes 1M,4M] [--conv 256x256x3x3] [--specs SPEC ...]
        [--repeats N] [--warmup N] [--threads N] [--markdown out.md] [--json out.json]

For each compressor spec and each gradient-shaped tensor this measures, on the CPU, with
``time.perf_counter`` and the median over ``--repeats`` steps after ``--warmup`` steps:

* compress and decompress time, per MB of float32 input (MB = 10^6 bytes) and in total;
* the *hook* time: the local work :mod:`autocomp.hook` adds for this layer in one step,
  without the collective itself (see :data:`MODEL`);
* the wire-byte ratio (float32 bytes / ``wire_bytes``) and the one-step relative error;
* the break-even bandwidth below which compressing the layer saves time with 2 ranks.

The tensors are synthetic but gradient-like (see :func:`gradient_like`): a dominant low-rank
part with a decaying spectrum, heavy-tailed noise and log-normal row/column scales. This is a
benchmark, not a test: nothing here asserts on speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from autocomp.compressors import (
    Collective,
    Compressor,
    NoCompression,
    PowerSGD,
    build_compressor,
    run_rounds_locally,
)

logger = logging.getLogger(__name__)

DEFAULT_SPECS: tuple[str, ...] = (
    "none",
    "fp16",
    "bf16",
    "int8",
    "qsgd:levels=16",
    "qsgd:levels=4",
    "sign",
    "topk:ratio=0.01",
    "topk:ratio=0.001",
    "randomk:ratio=0.01",
    "powersgd:rank=1",
    "powersgd:rank=4",
    "powersgd:rank=16",
)
DEFAULT_SIZES = "1M,4M"
"""Linear weights of 1024x1024 and 2048x2048 elements."""
DEFAULT_CONV = "256x256x3x3"
"""A 3x3 convolution weight with 256 input and output channels (ResNet-style)."""

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
    """Replays the per-layer work of :mod:`autocomp.hook` for one rank, minus the collective."""

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


# ---- machine and report ----------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Processor", "Hardware", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict[str, Any]:
    affinity = getattr(os, "sched_getaffinity", None)
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(affinity(0)) if affinity else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": "cpu",
        "load_average_before": load_average(),
    }


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: a sign of other work competing for the CPUs."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


COLUMNS = (
    "tensor",
    "spec",
    "collective",
    "EF",
    "ratio",
    "rel err",
    "compress ms/MB",
    "decompress ms/MB",
    "hook ms/MB",
    "hook ms",
    "hook ms min",
    "break-even Gbit/s",
)


def _ratio(ratio: float) -> str:
    if ratio >= 99.5:
        return f"{ratio:.0f}x"
    return f"{ratio:.1f}x" if ratio >= 9.95 else f"{ratio:.2f}x"


def _row(r: Result) -> list[str]:
    if r.break_even_gbps is not None:
        be = f"{r.break_even_gbps:.2f}"
    else:
        be = "-" if r.wire_bytes >= r.raw_bytes and r.hook_ms == 0 else "never"
    err = f"{r.rel_error:.3g}" + ("*" if r.rel_error_note != "one step" else "")
    return [
        r.tensor,
        r.spec,
        "all-reduce" if r.collective == Collective.ALL_REDUCE.value else "all-gather",
        "yes" if r.error_feedback else "no",
        _ratio(r.ratio),
        err,
        f"{r.compress_ms_per_mb:.2f}",
        f"{r.decompress_ms_per_mb:.2f}",
        f"{r.hook_ms_per_mb:.2f}",
        f"{r.hook_ms:.1f}",
        f"{r.hook_ms_min:.1f}",
        be,
    ]


def footnotes(results: list[Result]) -> list[str]:
    notes = []
    if any(r.rel_error_note != "one step" for r in results):
        notes.append(
            f"* PowerSGD error measured after {POWERSGD_WARMUP_STEPS} warm-up steps on the same "
            "tensor, without error feedback; others: one step, fresh state."
        )
    for r in results:
        if r.best_rank_rel_error is not None:
            notes.append(
                f"{r.tensor} {r.spec}: error {r.rel_error:.3g} vs {r.best_rank_rel_error:.3g} "
                "for the truncated SVD of the same rank"
            )
    for r in results:
        for mismatch in r.wire_bytes_mismatches:
            notes.append(f"WIRE-BYTES MISMATCH {r.tensor} {r.spec}: {mismatch}")
    return notes


def header_lines(machine: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    return [
        f"Machine: {machine['cpu']}, {machine['usable_cpus']} usable CPUs, torch "
        f"{machine['torch']} with {machine['torch_threads']} threads, Python "
        f"{machine['python']}, {machine['platform']} (CPU only)",
        f"Load average (1/5/15 min) before {machine['load_average_before']}, after "
        f"{machine.get('load_average_after')}: other work on the machine inflates the times.",
        f"Timing: median of {settings['repeats']} steps after {settings['warmup']} warm-up "
        "steps, time.perf_counter, cases interleaved round by round; MB = 10^6 bytes of "
        "float32 input.",
        f"Inputs: {GRADIENT}.",
        f"Model: {MODEL}",
    ]


def plain_table(results: list[Result], lines: list[str], notes: list[str]) -> str:
    """The report as aligned plain text (used when rich is not installed)."""
    rows = [list(COLUMNS)] + [_row(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    out = [*lines, ""]
    for n, row in enumerate(rows):
        cells = [
            cell.ljust(width) if i < 4 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join([*out, "", *notes])


def render_table(results: list[Result], lines: list[str], notes: list[str]) -> None:
    """Print the results, with rich when it is installed."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(plain_table(results, lines, notes))
        return
    console = Console(width=None if sys.stdout.isatty() else 200)
    for line in lines:
        console.print(line, highlight=False, soft_wrap=not sys.stdout.isatty())
    table = Table(show_lines=False)
    for i, name in enumerate(COLUMNS):
        table.add_column(name, justify="left" if i < 4 else "right")
    previous = None
    for r in results:
        if previous is not None and r.tensor != previous:
            table.add_section()
        previous = r.tensor
        table.add_row(*_row(r))
    console.print(table)
    for note in notes:
        console.print(note, highlight=False)


def markdown(results: list[Result], lines: list[str], notes: list[str], command: str) -> str:
    out = [f"Command: `{command}`", ""]
    out += [f"{line}  " for line in lines[:-1]] + [lines[-1], ""]
    out.append("| " + " | ".join(COLUMNS) + " |")
    out.append("|" + "|".join("---" if i < 4 else "---:" for i in range(len(COLUMNS))) + "|")
    for r in results:
        cells = [cell.replace("*", "\\*") for cell in _row(r)]
        cells[1] = f"`{cells[1]}`"
        out.append("| " + " | ".join(cells) + " |")
    if notes:
        out.append("")
        out += [f"- {note.removeprefix('* ')}" for note in notes]
    return "\n".join(out) + "\n"


# ---- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m autocomp.bench.compressors",
        description="Measure each compressor's compute cost on this machine (CPU) and the link "
        "bandwidth below which it pays off with 2 ranks.",
    )
    parser.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help="comma-separated Linear-weight sizes: element counts (1M = 2^20 elements, shaped "
        "as a near-square matrix) or explicit shapes like 1024x4096 (default: %(default)s)",
    )
    parser.add_argument(
        "--conv",
        default=DEFAULT_CONV,
        help="shape of an extra conv weight, or 'none' (default: %(default)s)",
    )
    parser.add_argument(
        "--specs",
        nargs="+",
        default=list(DEFAULT_SPECS),
        metavar="SPEC",
        help="compressor specs, space-separated, e.g. --specs fp16 topk:ratio=0.01,ef=false "
        "(default: 13 common settings)",
    )
    parser.add_argument("--repeats", type=int, default=11, help="timed steps (default: 11)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default: 2)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    parser.add_argument("--seed", type=int, default=0, help="tensor and compressor seed")
    parser.add_argument("--markdown", type=Path, default=None, help="write a markdown report")
    parser.add_argument("--json", type=Path, default=None, help="write all results as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    try:
        shapes = [parse_shape(t) for t in args.sizes.split(",") if t.strip()]
        if args.conv.strip().lower() not in ("", "none"):
            shapes.append(parse_shape(args.conv))
        compressors = [build_compressor(spec) for spec in args.specs]
    except ValueError as exc:
        parser.error(str(exc))
    if not shapes:
        parser.error("no tensors: give --sizes and/or --conv")

    command = shlex.join(["python", "-m", "autocomp.bench.compressors", *argv])
    machine = machine_info()
    settings = {
        "repeats": args.repeats,
        "warmup": args.warmup,
        "seed": args.seed,
        "world_size": WORLD_SIZE,
        "powersgd_warmup_steps": POWERSGD_WARMUP_STEPS,
        "mb_bytes": MB,
        "gradient": GRADIENT,
        "model": MODEL,
    }
    logger.debug("machine: %s", machine)

    started = time.perf_counter()
    cases: list[Case] = []
    for index, shape in enumerate(shapes):
        label = tensor_label(shape)
        x = gradient_like(shape, args.seed + index)
        svd = None
        if any(isinstance(c, PowerSGD) and c.compresses(shape) for c in compressors):
            svd = torch.linalg.svdvals(x.reshape(shape[0], -1))
        cases += [Case(label, x, c, args.seed, svd) for c in compressors]
    logger.info("%d cases: %d tensors x %d specs", len(cases), len(shapes), len(compressors))
    rounds = run_rounds(cases, repeats=args.repeats, warmup=args.warmup)
    settings["timed_round_seconds"] = [round(t, 3) for t in rounds]
    results = [case.result() for case in cases]
    machine["load_average_after"] = load_average()
    logger.info("measured %d cases in %.1f s", len(results), time.perf_counter() - started)

    lines = header_lines(machine, settings)
    notes = footnotes(results)
    if max(rounds) > 2 * min(rounds):
        warning = (
            f"NOTE: timed rounds took {min(rounds):.2f} to {max(rounds):.2f} s for the same "
            "work: something else was using the CPUs, so medians are inflated; 'hook ms min' "
            "is closer to this machine's cost when idle."
        )
        logger.warning("%s", warning)
        notes.append(warning)
    render_table(results, lines, notes)
    if args.markdown is not None:
        args.markdown.write_text(markdown(results, lines, notes, command), encoding="utf-8")
        logger.info("wrote %s", args.markdown)
    if args.json is not None:
        document = {
            "benchmark": "autocomp.bench.compressors",
            "command": command,
            "machine": machine,
            "settings": settings,
            "results": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        logger.info("wrote %s", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
