"""Compressor cost table on a CUDA GPU: encode and decode time of the hook's own hot path.

Run as (``make gpu-check`` runs it after the GPU tests)::

    python -m autocomp_bench.gpu_check [--sizes 1M,4M] [--conv 256x256x3x3] [--specs SPEC ...]
        [--repeats N] [--warmup N] [--device cuda] [--markdown out.md]

:mod:`autocomp_bench.compressors` measures the CPU with ``time.perf_counter``, which on a GPU
would only see kernel launches. This script times what the comm hook does per layer on the
device itself: :class:`autocomp.hook_layer.LayerReplay` (the exact hot path of the hook, the same
code the adaptive controller calibrates its cost model with) stamps CUDA events around the
encode (every round of ``encode_locally``: residual add, compress, error-feedback update) and
the decode (``decode_into`` of what a 2-rank collective delivers), and waits for the device at
the end of each step. Times are medians over ``--repeats`` steps after ``--warmup`` steps.

Without a CUDA device it says so and exits with status 2 (nothing is measured); ``--device
cpu`` runs the same replay on the CPU with host time, which checks the script itself.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from autocomp.compressors import Collective, Compressor, build_compressor
from autocomp.hook_layer import LayerReplay
from autocomp_bench.compressor_cost import gradient_like, parse_shape, tensor_label
from autocomp_bench.compressors import (
    DEFAULT_CONV,
    DEFAULT_SIZES,
    DEFAULT_SPECS,
    markdown_report,
    text_report,
)

logger = logging.getLogger(__name__)

__all__ = ["NO_CUDA_EXIT", "main"]

NO_CUDA_EXIT = 2
"""Exit status when the requested CUDA device does not exist (nothing was measured)."""
GATHERED = 2
"""Payloads an all-gather compressor decodes per step: 2 ranks, as in the CPU benchmark."""

# ``none`` is left out: the hook sends an uncompressed layer as it is, with no work to time.
GPU_SPECS: tuple[str, ...] = tuple(spec for spec in DEFAULT_SPECS if spec != "none")

COLUMNS = (
    "tensor",
    "spec",
    "collective",
    "ratio",
    "encode ms",
    "decode ms",
    "encode+decode ms",
    "GB/s",
)
LABEL_COLUMNS = 3
"""Columns that are labels (left-aligned); the rest are numbers."""


@dataclass(slots=True)
class Row:
    """One (tensor, compressor) measurement; times are medians in milliseconds."""

    tensor: str
    spec: str
    collective: str
    ratio: float
    encode_ms: float
    decode_ms: float
    """Decoding one payload."""
    total_ms: float
    """Encode plus the decode of everything one step receives (``GATHERED`` payloads for an
    all-gather, the one summed payload for an all-reduce)."""
    gb_per_s: float
    """float32 input bytes per second of ``total_ms`` (GB = 10^9 bytes)."""


def measure(
    compressor: Compressor, grad: torch.Tensor, *, repeats: int, warmup: int
) -> tuple[float, float]:
    """Median (encode, decode-per-payload) seconds of the hook's path for ``grad``."""
    replay = LayerReplay(compressor, grad, gathered=GATHERED)
    samples = []
    for index in range(warmup + repeats):
        with torch.no_grad():
            timing = replay.step()
        if index >= warmup:
            samples.append(timing)
    return (
        statistics.median(encode for encode, _ in samples),
        statistics.median(decode for _, decode in samples),
    )


def _row(
    label: str, compressor: Compressor, grad: torch.Tensor, encode: float, decode: float
) -> Row:
    shape = grad.shape
    raw = shape.numel() * 4
    wire = compressor.wire_bytes(shape, torch.float32)
    gathered = compressor.collective is Collective.ALL_GATHER
    total = encode + decode * (GATHERED if gathered else 1)
    return Row(
        tensor=label,
        spec=compressor.spec,
        collective="all-gather" if gathered else "all-reduce",
        ratio=raw / max(wire, 1),
        encode_ms=encode * 1e3,
        decode_ms=decode * 1e3,
        total_ms=total * 1e3,
        gb_per_s=raw / total / 1e9 if total > 0 else float("inf"),
    )


def _cells(row: Row) -> list[str]:
    return [
        row.tensor,
        row.spec,
        row.collective,
        f"{row.ratio:.1f}x" if row.ratio < 99.5 else f"{row.ratio:.0f}x",
        f"{row.encode_ms:.3f}",
        f"{row.decode_ms:.3f}",
        f"{row.total_ms:.3f}",
        f"{row.gb_per_s:.3g}",
    ]


def device_line(device: torch.device) -> str:
    """Which device (and software) the times come from."""
    versions = f"torch {torch.__version__}"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        versions += f", CUDA {torch.version.cuda}"
        return f"Device: {name} ({device}), {versions}; timed with CUDA events"
    return f"Device: {device} (dry run, not a GPU), {versions}; timed with the host clock"


def plain_table(rows: list[Row], lines: list[str]) -> str:
    """The table as aligned plain text, after the header ``lines``."""
    return text_report(COLUMNS, [_cells(r) for r in rows], lines, left=LABEL_COLUMNS)


def markdown(rows: list[Row], lines: list[str], command: str) -> str:
    """The table as markdown, after the command and the header ``lines``."""
    cells = [_cells(r) for r in rows]
    return markdown_report(COLUMNS, cells, lines, command, left=LABEL_COLUMNS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m autocomp_bench.gpu_check",
        description="Time each compressor's encode and decode in autocomp's comm hook on a "
        "CUDA GPU (CUDA events), for a few layer shapes.",
    )
    parser.add_argument(
        "--sizes",
        default=DEFAULT_SIZES,
        help="comma-separated Linear-weight sizes: element counts (1M = 2^20 elements) or "
        "shapes like 1024x4096 (default: %(default)s)",
    )
    parser.add_argument(
        "--conv",
        default=DEFAULT_CONV,
        help="shape of an extra conv weight, or 'none' (default: %(default)s)",
    )
    parser.add_argument(
        "--specs",
        nargs="+",
        default=list(GPU_SPECS),
        metavar="SPEC",
        help="compressor specs (default: the CPU benchmark's, without 'none')",
    )
    parser.add_argument("--repeats", type=int, default=21, help="timed steps (default: 21)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default: 3)")
    parser.add_argument(
        "--device",
        default="cuda",
        help="device to time on (default: cuda); 'cpu' is a dry run of the script itself",
    )
    parser.add_argument("--seed", type=int, default=0, help="tensor and compressor seed")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here")
    return parser


def _missing_cuda(device: torch.device) -> str | None:
    """Why ``device`` cannot be used, or None when it can."""
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        built = torch.version.cuda or "none (a CPU-only build)"
        return (
            f"no CUDA device is available (torch.cuda.is_available() is False; torch "
            f"{torch.__version__}, CUDA runtime {built}). Nothing was measured: run this on a "
            "machine with an NVIDIA GPU, or pass --device cpu for a dry run of the script."
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"{device} does not exist: this machine has {count} CUDA device(s)"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    try:
        device = torch.device(args.device)
        shapes = [parse_shape(t) for t in args.sizes.split(",") if t.strip()]
        if args.conv.strip().lower() not in ("", "none"):
            shapes.append(parse_shape(args.conv))
        compressors = [build_compressor(spec) for spec in args.specs]
    except (RuntimeError, ValueError) as exc:
        parser.error(str(exc))
    if not shapes:
        parser.error("no tensors: give --sizes and/or --conv")
    problem = _missing_cuda(device)
    if problem is not None:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return NO_CUDA_EXIT
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())

    started = time.perf_counter()
    rows = []
    for index, shape in enumerate(shapes):
        label = tensor_label(shape)
        grad = gradient_like(shape, args.seed + index).to(device)
        for compressor in compressors:
            encode, decode = measure(compressor, grad, repeats=args.repeats, warmup=args.warmup)
            rows.append(_row(label, compressor, grad, encode, decode))
            logger.debug("%s %s: %.3f + %.3f ms", label, compressor.spec, encode, decode)
    logger.info("measured %d cases in %.1f s", len(rows), time.perf_counter() - started)

    command = shlex.join(["python", "-m", "autocomp_bench.gpu_check", *argv])
    lines = [
        device_line(device),
        f"Timing: median of {args.repeats} steps after {args.warmup} warm-up steps of "
        "autocomp.hook_layer.LayerReplay (the comm hook's per-layer work, collective excluded).",
        "encode = residual add, every compress round, error-feedback update; decode = one "
        f"payload; encode+decode = encode plus decoding one step's receipt ({GATHERED} payloads "
        f"for all-gather, as with {GATHERED} ranks; one summed payload for all-reduce); GB/s = "
        "float32 input bytes / encode+decode (GB = 10^9 bytes).",
    ]
    print(plain_table(rows, lines))
    if args.markdown is not None:
        args.markdown.write_text(markdown(rows, lines, command), encoding="utf-8")
        logger.info("wrote %s", args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
