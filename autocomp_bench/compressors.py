"""Compute cost of every compressor on this machine, with the bandwidth where it starts to pay.

Run as::

    python -m autocomp_bench.compressors [--sizes 1M,4M] [--conv 256x256x3x3] [--specs SPEC ...]
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
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from autocomp.compressors import Collective, PowerSGD, build_compressor
from autocomp_bench import report
from autocomp_bench.compressor_cost import (
    GRADIENT,
    MB,
    MODEL,
    POWERSGD_WARMUP_STEPS,
    WORLD_SIZE,
    Case,
    Result,
    gradient_like,
    parse_shape,
    run_rounds,
    tensor_label,
)
from autocomp_bench.machine import load_average, machine_info

logger = logging.getLogger(__name__)

__all__ = ["main"]

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

# ---- report ----------------------------------------------------------------------------------

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
LABEL_COLUMNS = 4
"""Columns that are labels (left-aligned); the rest are numbers."""


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


def text_report(
    columns: Sequence[str],
    rows: list[list[str]],
    lines: list[str],
    *,
    left: int,
    notes: Sequence[str] | None = None,
) -> str:
    """Header ``lines``, then the aligned table, then ``notes`` (after a blank line; no notes
    section when None). Shared with :mod:`autocomp_bench.gpu_check`, whose table has the same
    layout."""
    out = [*lines, "", *report.plain_table(columns, rows, left=left)]
    if notes is not None:
        out += ["", *notes]
    return "\n".join(out)


def markdown_report(
    columns: Sequence[str],
    rows: list[list[str]],
    lines: list[str],
    command: str,
    *,
    left: int,
    notes: Sequence[str] = (),
) -> str:
    """The markdown form of :func:`text_report`: the command, the header lines, the table
    with column 1 (the compressor spec) set as code, and the notes as a list."""
    out = [f"Command: `{command}`", ""]
    out += [f"{line}  " for line in lines[:-1]] + [lines[-1], ""]
    cells = [[row[0], f"`{row[1]}`", *row[2:]] for row in rows]
    out += report.markdown_table(columns, cells, left=left)
    if notes:
        out.append("")
        out += [f"- {note.removeprefix('* ')}" for note in notes]
    return "\n".join(out) + "\n"


def plain_table(results: list[Result], lines: list[str], notes: list[str]) -> str:
    """The report as aligned plain text (used when rich is not installed)."""
    rows = [_row(r) for r in results]
    return text_report(COLUMNS, rows, lines, left=LABEL_COLUMNS, notes=notes)


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
        table.add_column(name, justify="left" if i < LABEL_COLUMNS else "right")
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
    rows = [[cell.replace("*", "\\*") for cell in _row(r)] for r in results]
    return markdown_report(COLUMNS, rows, lines, command, left=LABEL_COLUMNS, notes=notes)


# ---- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m autocomp_bench.compressors",
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

    command = shlex.join(["python", "-m", "autocomp_bench.compressors", *argv])
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
            "benchmark": "autocomp_bench.compressors",
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
