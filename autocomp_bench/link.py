"""End-to-end training over a real shaped link: autocomp against plain DDP and PyTorch's hooks.

Run as::

    python -m autocomp_bench.link [--scenario rates|drop|convergence|all]
        [--rates 10mbit,...,unshaped] [--steps N] [--warmup N] [--window W] [--quick]
        [--convergence-workload digits|lm] [--convergence-rate 50mbit] [--convergence-steps N]
        [--json out.json] [--markdown out.md] [--plot out.png]

(or ``autocomp-bench link ...``). Needs root and iproute2 for the shaped link
(:mod:`autocomp_bench.shaped_link`); without them only the unshaped loopback comparison runs.

Two ranks, each in its own network namespace, joined by a veth pair whose both ends carry a
``tc tbf`` rate limit; gloo runs over the veth (:mod:`autocomp_bench.harness`). Each rank uses
one torch thread. The workload of ``rates`` and ``drop`` is the task ``mlp-lm-large``
(:mod:`autocomp_bench.tasks`: :class:`~autocomp_bench.workloads.MLPLanguageModel`, context 32,
embedding 64, hidden 3072, about 16.5M parameters, trained with Adam, lr 1e-3, batch 64) on
the byte-level stdlib-source corpus. The scenarios:

* ``rates`` (:mod:`autocomp_bench.rates`): at every rate, plain DDP, PyTorch's fp16 and
  PowerSGD hooks and autocomp train from the same seed; median step time per method;
* ``drop`` (:mod:`autocomp_bench.drop`): the link drops from 1 Gbit/s to 50 Mbit/s mid-run;
  how many windows autocomp needs to recover;
* ``convergence`` (:mod:`autocomp_bench.convergence`): a full training run at 50 Mbit/s;
  autocomp's final validation accuracy/loss against plain DDP's.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autocomp_bench.convergence import (
    CONVERGENCE_RATE,
    CONVERGENCE_STEPS,
    convergence_lines,
    run_convergence,
)
from autocomp_bench.drop import RECOVERY_DEFINITION, drop_lines, run_drop
from autocomp_bench.harness import (
    GLOO_TIMEOUT_S,
    Network,
    Rate,
    Runner,
    exit_on_sigterm,
    machine_summary,
    open_network,
    parse_rates,
    snapshot_code,
)
from autocomp_bench.machine import load_average
from autocomp_bench.rates import (
    METHODS,
    POWERSGD_NOTE,
    TABLE_COLUMNS,
    autocomp_detail_lines,
    by_method,
    plot_rates,
    rate_checks,
    rate_rows,
    rate_table_lines,
    run_rates,
    succeeded,
)
from autocomp_bench.report import MB, check_from_dict, jsonable, markdown_table
from autocomp_bench.shaped_link import parse_rate, shaped_link_unavailable_reason
from autocomp_bench.tasks import MLP_LM_LARGE, MLP_LM_LARGE_BATCH, MLP_LM_LARGE_LR

logger = logging.getLogger(__name__)

__all__ = ["main"]

DEFAULT_RATES = "10mbit,50mbit,200mbit,1gbit,unshaped"
QUICK_RATES = "200mbit,unshaped"
DEFAULT_WINDOW = 5


# ---- reports ---------------------------------------------------------------------------------


def render_markdown(document: dict[str, Any]) -> str:
    out = [f"Command: `{document['command']}`", ""]
    m = document["machine"]
    out.append(
        f"Machine: {m['cpu']}, {m['usable_cpus']} usable CPUs, torch {m['torch']} (CPU), "
        f"{m['torch_threads_per_rank']} thread per rank, {m['backend']}, {m['network']}. "
        f"Model: {document['model']}. autocomp code {document.get('code_digest')}. "
        f"Total runtime {document['runtime_s'] / 60:.1f} min."
    )
    out.append("")
    rates = document.get("rates")
    if rates is not None:
        out.append(f"Note: {POWERSGD_NOTE}")
        out.append("")
        for rate in rates["rates"]:
            out.append(f"### {rate}")
            out.append("")
            out += markdown_table(TABLE_COLUMNS, rate_rows(rates["results"], rate))
            auto = by_method(rates["results"], rate, "autocomp")
            if succeeded(auto):
                assert auto is not None
                out += ["", "```", *autocomp_detail_lines(auto), "```"]
            out.append("")
        out.append("Checks:")
        out.append("")
        out += ["```", *(c["line"] for c in rates["checks"]), "```", ""]
    drop = document.get("drop")
    if drop is not None:
        out.append("### Link drop")
        out.append("")
        out.append(RECOVERY_DEFINITION)
        out.append("")
        lines = drop_lines({**drop, "check": check_from_dict(drop["check"])})
        out += ["```", *lines, "```", ""]
    convergence = document.get("convergence")
    if convergence is not None:
        out.append("### Convergence")
        out.append("")
        out += [*convergence_lines(convergence, markdown=True), ""]
    return "\n".join(out)


# ---- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m autocomp_bench.link",
        description="Train a 16.5M-parameter LM on 2 gloo ranks over a tbf-shaped veth link: "
        "autocomp vs plain DDP, fp16 and PowerSGD hooks at several rates (scenario 'rates'), "
        "autocomp's recovery when the link drops mid-run (scenario 'drop'), and autocomp's "
        "final validation accuracy/loss against plain DDP's after a full training run at "
        "50 Mbit/s (scenario 'convergence', digits CNN by default).",
    )
    parser.add_argument(
        "--scenario", choices=("rates", "drop", "convergence", "all"), default="all"
    )
    parser.add_argument(
        "--rates",
        default=None,
        help=f"comma-separated link rates (default: {DEFAULT_RATES}; --quick: {QUICK_RATES})",
    )
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="comma-separated methods to compare (default: %(default)s)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="measured steps per run at every rate (default: by rate, 3 at 10 Mbit/s to 20 at "
        "1 Gbit/s and unshaped)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed steps of the peers (default: by rate, 1 at 10 Mbit/s, 2 at 50 Mbit/s, "
        "else 5; powersgd takes at least start_powerSGD_iter + 1 = 3)",
    )
    parser.add_argument(
        "--window", type=int, default=DEFAULT_WINDOW, help="autocomp window (default: 5)"
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"smoke run: rates {QUICK_RATES}, few steps"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--drop-from", default="1gbit", help="rate before the drop")
    parser.add_argument("--drop-to", default="50mbit", help="rate after the drop")
    parser.add_argument(
        "--drop-step",
        type=int,
        default=None,
        help="step before which the link drops (default: 6.5 windows in, mid-window)",
    )
    parser.add_argument(
        "--post-drop-windows",
        type=int,
        default=None,
        help="whole windows after the one containing the drop (default: 8; --quick: 4)",
    )
    parser.add_argument(
        "--convergence-workload",
        choices=("digits", "lm"),
        default="digits",
        help="model of the convergence scenario (default: %(default)s)",
    )
    parser.add_argument(
        "--convergence-rate",
        default=CONVERGENCE_RATE,
        help="link rate of the convergence scenario (default: %(default)s)",
    )
    parser.add_argument(
        "--convergence-steps",
        type=int,
        default=None,
        help="steps per method in the convergence scenario (default: digits "
        f"{CONVERGENCE_STEPS['digits']}, lm {CONVERGENCE_STEPS['lm']})",
    )
    parser.add_argument(
        "--convergence-window",
        type=int,
        default=None,
        help="override autocomp's window there (default: the policy preset's)",
    )
    parser.add_argument(
        "--convergence-warmup",
        type=int,
        default=None,
        help="override autocomp's warm-up steps there (default: the policy preset's)",
    )
    parser.add_argument(
        "--no-drop-reference",
        action="store_true",
        help="skip the plain all-reduce reference run at the post-drop rate",
    )
    parser.add_argument(
        "--gloo-timeout", type=float, default=GLOO_TIMEOUT_S, help="gloo timeout in seconds"
    )
    parser.add_argument("--json", type=Path, default=None, help="write all results as JSON")
    parser.add_argument("--markdown", type=Path, default=None, help="write a markdown report")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG plot (rates)")
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        metavar="JSON",
        help="run nothing: re-render the report (text, --markdown, --plot) of a saved --json",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.window < 1 or args.threads < 1:
        parser.error("--window and --threads must be >= 1")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.warmup is not None and args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.convergence_steps is not None and args.convergence_steps < 1:
        parser.error("--convergence-steps must be >= 1")
    if args.convergence_window is not None and args.convergence_window < 1:
        parser.error("--convergence-window must be >= 1")
    if args.convergence_warmup is not None and args.convergence_warmup < 0:
        parser.error("--convergence-warmup must be >= 0")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or not methods:
        parser.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    args.methods = [m for m in METHODS if m in methods]
    try:
        rates = parse_rates(args.rates or (QUICK_RATES if args.quick else DEFAULT_RATES))
        parse_rate(args.drop_from)
        parse_rate(args.drop_to)
        parse_rate(args.convergence_rate)
    except ValueError as err:
        parser.error(str(err))
    if args.from_json is not None:
        document = json.loads(args.from_json.read_text(encoding="utf-8"))
        print_report(document)
        return _write_outputs(document, args)
    exit_on_sigterm()

    command = shlex.join(["python", "-m", "autocomp_bench.link", *argv])
    reason = shaped_link_unavailable_reason()
    started = time.monotonic()
    document: dict[str, Any] = {"benchmark": "autocomp_bench.link", "command": command}
    print(f"autocomp link benchmark: {command}", flush=True)
    with tempfile.TemporaryDirectory(prefix="autocomp-link-") as tmp:
        root = Path(tmp)
        code_dir, digest = snapshot_code(root)
        document["code_digest"] = digest
        print(
            f"autocomp code snapshot {digest} (workers import this copy, so edits to the tree "
            "during the run do not mix versions)",
            flush=True,
        )
        if reason is not None:
            print(
                f"SHAPED LINK UNAVAILABLE: {reason}.\nRunning ONLY the unshaped loopback "
                "comparison (no rate shaping, no drop or convergence scenario); these numbers "
                "say nothing about slow links.",
                flush=True,
            )
            rates = [Rate("unshaped (loopback)", None)]
        config = Runner.Config(gloo_timeout_s=args.gloo_timeout, code_dir=code_dir)
        with open_network(shaped=reason is None) as network:
            document.update(
                _run_all(
                    network,
                    Runner(network, root, config),
                    rates,
                    args,
                    drop=reason is None and args.scenario in ("drop", "all"),
                )
            )
        document["shaped_link_unavailable"] = reason
    document["runtime_s"] = time.monotonic() - started
    document["machine"]["load_average_after"] = load_average()
    print(f"\ntotal runtime {document['runtime_s'] / 60:.1f} min", flush=True)
    document = jsonable(document)
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return _write_outputs(document, args)


def _document_rates(document: dict[str, Any]) -> list[Rate]:
    section = document["rates"]
    return [
        Rate(label, mbit)
        for label, mbit in zip(section["rates"], section["rate_mbit"], strict=True)
    ]


def print_report(document: dict[str, Any]) -> None:
    """The text report of a saved document (what a live run prints as it goes)."""
    print(f"report of: {document['command']} (autocomp code {document.get('code_digest')})")
    if document.get("rates") is not None:
        for rate in document["rates"]["rates"]:
            print()
            print("\n".join(rate_table_lines(document["rates"]["results"], rate)))
        print("\nchecks:")
        for check in document["rates"]["checks"]:
            print(check["line"])
    drop = document.get("drop")
    if drop is not None:
        print()
        print("\n".join(drop_lines({**drop, "check": check_from_dict(drop["check"])})))
    convergence = document.get("convergence")
    if convergence is not None:
        print()
        print("\n".join(convergence_lines(convergence)))
    print(f"\ntotal runtime {document['runtime_s'] / 60:.1f} min")


def _write_outputs(document: dict[str, Any], args: argparse.Namespace) -> int:
    """Write --markdown and --plot; exit status 0 only if every check passed."""
    if args.markdown is not None:
        args.markdown.write_text(render_markdown(document), encoding="utf-8")
        print(f"wrote {args.markdown}")
    if args.plot is not None and document.get("rates") is not None:
        plot_rates(document["rates"]["results"], _document_rates(document), args.plot)
        print(f"wrote {args.plot}")
    checks = []
    if document.get("rates") is not None:
        checks += document["rates"]["checks"]
    if document.get("drop") is not None:
        checks.append(document["drop"]["check"])
    if document.get("convergence") is not None:
        checks.append(document["convergence"]["check"])
    return 0 if all(c["passed"] for c in checks) else 1


def _run_all(
    network: Network,
    runner: Runner,
    rates: list[Rate],
    args: argparse.Namespace,
    drop: bool,
) -> dict[str, Any]:
    import torch

    from autocomp_bench.workloads import MLPLanguageModel

    out: dict[str, Any] = {"machine": machine_summary(network, args.threads)}
    numel = sum(p.numel() for p in MLPLanguageModel(**MLP_LM_LARGE).parameters())
    out["model"] = (
        f"MLPLanguageModel(context=32, embed=64, hidden=3072), {numel:,} parameters "
        f"({4 * numel / MB:.1f} MB of float32 gradient), Adam lr {MLP_LM_LARGE_LR:g}, "
        f"batch {MLP_LM_LARGE_BATCH}"
    )
    if args.scenario == "convergence":
        out["model"] = f"{args.convergence_workload} (see the convergence section)"
    print(f"model: {out['model']}; torch {torch.__version__}", flush=True)
    print(f"network: {out['machine']['network']}", flush=True)
    if args.scenario in ("rates", "all"):
        if "powersgd" in args.methods:
            print(f"NOTE: {POWERSGD_NOTE}", flush=True)
        results = run_rates(network, runner, rates, args)
        checks = rate_checks(results, rates)
        print("\nchecks:")
        for check in checks:
            print(check.line(), flush=True)
        out["rates"] = {
            "rates": [r.label for r in rates],
            "rate_mbit": [r.mbit for r in rates],
            "results": results,
            "checks": checks,
            "powersgd_note": POWERSGD_NOTE,
        }
    if drop:
        out["drop"] = run_drop(network, runner, args)
        out["drop"]["definition"] = RECOVERY_DEFINITION
    elif args.scenario in ("drop", "all"):
        print("drop scenario skipped: it needs the shaped link", flush=True)
    if args.scenario in ("convergence", "all"):
        if network.kind == "shaped":
            out["convergence"] = run_convergence(network, runner, args)
        else:
            print("convergence scenario skipped: it needs the shaped link", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
