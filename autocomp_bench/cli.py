"""``autocomp-bench``: the benchmark suite's command line.

Each subcommand forwards its remaining arguments to the ``main(argv)`` of a benchmark module,
so ``autocomp-bench compressors --help`` shows that benchmark's own options.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

__all__ = ["main"]

_Entry = Callable[[list[str] | None], int]

# name -> (module whose main(argv) runs it, one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    "compressors": (
        "autocomp_bench.compressors",
        "per-compressor compute cost on this machine and break-even link bandwidth",
    ),
    "link": (
        "autocomp_bench.link",
        "end-to-end training on 2 ranks over a shaped link: autocomp vs DDP, fp16, PowerSGD",
    ),
    "tta": (
        "autocomp_bench.tta",
        "time to accuracy: validation metric per method in the same wall-clock budget",
    ),
    "in-turn": (
        "autocomp_bench.in_turn",
        "step time of several methods stepped in turn on one link (drift falls on all alike)",
    ),
    "hier": (
        "autocomp_bench.hier",
        "two nodes x 2 ranks over a shaped link: DDP, flat/hierarchical autocomp, HSDP",
    ),
    "advisor": (
        "autocomp_bench.advisor_accuracy",
        "advisor predictions vs measured step times on the shaped link (50, 200 Mbit/s)",
    ),
    "quality": (
        "autocomp_bench.quality",
        "per-step quality of compressors against PyTorch's hooks and plain DDP (loopback)",
    ),
    "overhead": (
        "autocomp_bench.overhead",
        "cost of the comm hook and the profiler when nothing is compressed (loopback)",
    ),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autocomp-bench",
        description="autocomp benchmarks. Run 'autocomp-bench COMMAND --help' for a "
        "command's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _entry(name: str) -> _Entry:
    module = importlib.import_module(COMMANDS[name][0])
    entry: _Entry = module.main
    return entry


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``autocomp-bench COMMAND [ARGS...]``; returns the command's exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] not in COMMANDS:
        # Prints the usage for -h/--help, or an error naming the valid commands, and exits.
        _parser().parse_args(args)
        return 2
    return _entry(args[0])(args[1:])


if __name__ == "__main__":
    sys.exit(main())
