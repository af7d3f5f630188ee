"""Nodes over a shaped link: hierarchical autocomp, flat autocomp, DDP, PyTorch's comm hooks
and HSDP.

Run as::

    autocomp-bench hier [--task gpt] [--rate 200mbit] [--budget-s 40] [--evals 4]
        [--nodes 2] [--ranks-per-node 2]
        [--methods allreduce,fp16,powersgd,flat,hier,hsdp,hsdp-autocomp,hsdp-adaptive]
        [--threads 1]
        [--json out.json] [--markdown out.md] [--from-json saved.json]

(or ``python -m autocomp_bench.hier``). ``nodes x ranks-per-node`` gloo ranks (default 2 x 2)
in as many "nodes": network namespaces (:class:`~autocomp_bench.shaped_link.ShapedLink` with
one host per node), every rank started with the environment torchrun gives it (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` = ranks per node, ``GROUP_RANK`` = node,
``MASTER_ADDR`` = node 0's address, ``MASTER_PORT``) and ``GLOO_SOCKET_IFNAME`` = its
namespace's veth. The ranks of a node connect to the node's own address, which Linux routes
over the namespace's loopback; only traffic between nodes crosses a veth, which ``tc tbf``
shapes on both ends (default 200 Mbit/s): with two nodes one veth pair joins them, with more
each node's veth leads to a bridge in a hub namespace. Every method trains a fresh model of
one task (:mod:`autocomp_bench.tasks`) from the same seed for the same wall-clock budget with
the shared budget loop (:mod:`autocomp_bench.worker`, via :mod:`autocomp_bench.hier_worker`);
the report (:mod:`autocomp_bench.hier_report`) compares the validation loss they reach, their
steps and median step, the bytes each node's veth carried (its kernel counters, read in each
namespace before and after each method), and whether the replicas' final parameters are
bit-identical.

With one rank per node the hierarchy has nothing to reduce inside a node (``autocomp.wrap``
refuses ``hierarchy=True`` there), so ``hier`` is reported as skipped; the other methods run
(HSDP on an ``(nodes, 1)`` mesh).

Needs root and iproute2; there is no loopback fallback (one machine cannot tell nodes apart
without namespaces).
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autocomp_bench.harness import (
    GLOO_TIMEOUT_S,
    SEED,
    exit_on_sigterm,
    snapshot_code,
    worker_pythonpath,
)
from autocomp_bench.hier_report import (
    count_word,
    hier_checks,
    link_delta,
    render_markdown,
    summarize_method,
    text_report,
)
from autocomp_bench.machine import (
    load_average,
    machine_busy_seconds,
    machine_info,
    own_cpu_seconds,
    tail,
)
from autocomp_bench.report import jsonable
from autocomp_bench.shaped_link import ShapedLink, parse_rate, shaped_link_unavailable_reason
from autocomp_bench.worker import POWERSGD_RANK

logger = logging.getLogger(__name__)

__all__ = [
    "METHODS",
    "HierBenchmark",
    "build_parser",
    "main",
    "method_descriptions",
    "method_problems",
    "rank_env",
]

DEFAULT_NODES = 2
DEFAULT_RANKS_PER_NODE = 2
DEFAULT_TASK = "gpt"
DEFAULT_RATE = "200mbit"
TARGET_OVERLAP = 0.9
WORKER_MODULE = "autocomp_bench.hier_worker"
FIRST_PORT = 29500
STARTUP_S = 120.0
"""Per run, at least: four interpreters importing torch on a shared machine, the rendezvous,
set-up."""
STARTUP_PER_RANK_S = STARTUP_S / (DEFAULT_NODES * DEFAULT_RANKS_PER_NODE)
"""Start-up per rank beyond that: every rank imports torch on the same few CPUs."""
EVAL_MARGIN_S = 15.0


def method_descriptions(
    nodes: int = DEFAULT_NODES, ranks_per_node: int = DEFAULT_RANKS_PER_NODE
) -> dict[str, str]:
    """Method name -> one line for the report, naming this topology's world and mesh."""
    world = nodes * ranks_per_node
    return {
        "allreduce": f"plain DDP all-reduce (gloo's ring over all {world} ranks)",
        "fp16": f"DDP with PyTorch's `fp16_compress_hook` (one ring over all {world} ranks)",
        "powersgd": f"DDP with PyTorch's `powerSGD_hook`, rank {POWERSGD_RANK}, one bucket, "
        "error feedback and warm start",
        "flat": f"`autocomp.wrap(ddp, target_overlap={TARGET_OVERLAP}, hierarchy=False)`",
        "hier": f"`autocomp.wrap(ddp, target_overlap={TARGET_OVERLAP}, hierarchy=True)`",
        "hsdp": f"FSDP2 `fully_shard` on the {nodes}x{ranks_per_node} (replicate, shard) mesh "
        "(FSDP's own HSDP; blocks, then the root)",
        "hsdp-autocomp": '`fully_shard(..., mesh=mesh["shard"])`, then '
        "`autocomp.wrap_fsdp(model, mesh)` (its default plan)",
        "hsdp-adaptive": '`fully_shard(..., mesh=mesh["shard"])`, then '
        f"`autocomp.wrap_fsdp(model, mesh, target_overlap={TARGET_OVERLAP})` (the policy "
        "decides)",
    }


METHODS: dict[str, str] = method_descriptions()
"""Method name -> one line for the report, for the default 2x2 topology (the names are the
same for every topology)."""


def rank_env(
    rank: int,
    addresses: list[str],
    interfaces: list[str],
    master_port: int,
    ranks_per_node: int = DEFAULT_RANKS_PER_NODE,
) -> dict[str, str]:
    """torchrun's environment for global ``rank`` (node ``rank // ranks_per_node``), plus the
    gloo interface.

    ``addresses[n]``/``interfaces[n]``: node ``n``'s address and veth name in its namespace;
    there are as many nodes as addresses.
    """
    nodes = len(addresses)
    if len(interfaces) != nodes:
        raise ValueError(
            f"need as many addresses as interfaces (one per node), got {nodes} and "
            f"{len(interfaces)}"
        )
    if nodes < 2:
        raise ValueError(f"need the addresses and interfaces of at least 2 nodes, got {nodes}")
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
    world = nodes * ranks_per_node
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    if not 0 < master_port < 65536:
        raise ValueError(f"master_port out of range: {master_port}")
    node, local = divmod(rank, ranks_per_node)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(ranks_per_node),
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": str(nodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": addresses[0],
        "MASTER_PORT": str(master_port),
        "GLOO_SOCKET_IFNAME": interfaces[node],
    }


def _wrap_has_hierarchy() -> bool:
    """Whether the installed ``autocomp.wrap`` takes ``hierarchy`` (older ones do not)."""
    import autocomp

    return "hierarchy" in inspect.signature(autocomp.wrap).parameters


def method_problems(ranks_per_node: int = DEFAULT_RANKS_PER_NODE) -> dict[str, str]:
    """Methods the installed autocomp or torch, or the topology, cannot run here, with the
    reason."""
    import autocomp

    problems = {}
    if not _wrap_has_hierarchy():
        problems["hier"] = "autocomp.wrap has no hierarchy keyword"
    elif ranks_per_node < 2:
        # autocomp refuses hierarchy=True with one rank per node: nothing to reduce inside it.
        problems["hier"] = (
            f"hierarchy=True needs at least 2 ranks per node (--ranks-per-node {ranks_per_node})"
        )
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        for name in ("hsdp", "hsdp-autocomp", "hsdp-adaptive"):
            problems[name] = "torch has no FSDP2 fully_shard"
    if not hasattr(autocomp, "wrap_fsdp"):
        problems.setdefault("hsdp-autocomp", "autocomp has no wrap_fsdp")
        problems.setdefault("hsdp-adaptive", "autocomp has no wrap_fsdp")
    return problems


def link_counters(link: ShapedLink) -> list[dict[str, int]]:
    """``{"tx_bytes", "rx_bytes"}`` of each node's veth end, read inside its namespace."""
    out = []
    for ns, dev in zip(link.namespaces, link.interfaces, strict=True):
        text = subprocess.run(
            ["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        out.append(parse_link_stats(text))
    return out


def parse_link_stats(text: str) -> dict[str, int]:
    """tx/rx bytes from ``ip -j -s link show dev X``."""
    stats = json.loads(text)[0]["stats64"]
    return {"tx_bytes": int(stats["tx"]["bytes"]), "rx_bytes": int(stats["rx"]["bytes"])}


class HierBenchmark:
    """Runs every method on one shaped link, one after the other, and builds the document."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        task: str = DEFAULT_TASK
        methods: list[str] = field(default_factory=lambda: list(METHODS))
        rate: str = DEFAULT_RATE
        rate_mbit: float | None = 200.0
        budget_s: float = 40.0
        """Training seconds per method (evaluation excluded)."""
        evals: int = 4
        threads: int = 1
        """torch threads per rank."""
        seed: int = SEED
        gloo_timeout_s: float = GLOO_TIMEOUT_S
        nodes: int = DEFAULT_NODES
        """Network namespaces ("nodes") on the shaped link; at least 2."""
        ranks_per_node: int = DEFAULT_RANKS_PER_NODE
        """gloo ranks in each node's namespace (they talk over its loopback); at least 1."""

    def __init__(self, config: Config, link: ShapedLink, root: Path, code_dir: Path | None):
        self.config = config
        self.link = link
        self.root = root
        self.code_dir = code_dir
        self.port = FIRST_PORT
        self.count = 0

    @property
    def world_size(self) -> int:
        """Ranks of every method's run: nodes x ranks per node."""
        return self.config.nodes * self.config.ranks_per_node

    def worker_config(self, method: str) -> dict[str, Any]:
        c = self.config
        cfg: dict[str, Any] = {
            "loop": "hier-budget",
            "task": c.task,
            "method": method,
            "seed": c.seed,
            "threads": c.threads,
            "budget_s": c.budget_s,
            "evals": c.evals,
            "gloo_timeout_s": c.gloo_timeout_s,
        }
        if method in ("flat", "hier"):
            cfg["method"] = "adaptive"
            kwargs: dict[str, Any] = {"target_overlap": TARGET_OVERLAP}
            if method == "hier" or _wrap_has_hierarchy():
                kwargs["hierarchy"] = method == "hier"  # flat: without it where wrap lacks it
            cfg["adaptive_kwargs"] = kwargs
        return cfg

    def timeout_s(self, gradient_bytes: int) -> float:
        """Budget, start-up, evaluations and two slow uncompressed steps, with 50% slack.

        Start-up grows with the ranks (each imports torch on the same few CPUs), never below
        :data:`STARTUP_S`.
        """
        c = self.config
        world = self.world_size
        step = 5.0
        if c.rate_mbit is not None:
            # gloo's ring over W ranks crosses each node's uplink with 2 (W - 1) / W of the
            # gradient (1.5x for 4 ranks; with a hub, in and out of it at the same rate).
            crossing = 2 * (world - 1) / world
            step += crossing * gradient_bytes * 8 / (c.rate_mbit * 1e6) / 0.9
        startup = max(STARTUP_S, STARTUP_PER_RANK_S * world)
        return 1.5 * (c.budget_s + (c.evals + 1) * EVAL_MARGIN_S + 2 * step) + startup

    def launch(self, method: str, timeout_s: float) -> dict[str, Any]:
        """Start every rank of one method; their results, link bytes and wall time."""
        self.count += 1
        self.port += 1  # a private network, but a fresh port avoids TIME_WAIT
        run_dir = self.root / f"run{self.count:02d}-{method}"
        run_dir.mkdir(parents=True)
        cfg = {**self.worker_config(method), "run_dir": str(run_dir)}
        config_path = run_dir / "config.json"
        config_path.write_text(json.dumps(cfg), encoding="utf-8")
        argv = [sys.executable, "-m", WORKER_MODULE, str(config_path)]
        extra = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(self.config.threads)}
        pythonpath = worker_pythonpath(self.code_dir)
        if pythonpath:
            extra["PYTHONPATH"] = pythonpath
        addresses, interfaces = self.link.addresses, self.link.interfaces
        before = link_counters(self.link)
        busy_before, own_before = machine_busy_seconds(), own_cpu_seconds()
        started = time.monotonic()
        procs: list[subprocess.Popen[Any]] = []
        logs = []
        error: str | None = None
        try:
            per_node = self.config.ranks_per_node
            for rank in range(self.world_size):
                log = open(run_dir / f"rank{rank}.log", "w", encoding="utf-8")  # noqa: SIM115
                logs.append(log)
                env = {**rank_env(rank, addresses, interfaces, self.port, per_node), **extra}
                node = rank // per_node
                procs.append(
                    self.link.popen(
                        node, argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir
                    )
                )
            while error is None:
                codes = [p.poll() for p in procs]
                if all(c == 0 for c in codes):
                    break
                failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    error = ", ".join(f"rank {r} exited with {c}" for r, c in failed)
                elif time.monotonic() - started > timeout_s:
                    error = f"timed out after {timeout_s:.0f} s"
                else:
                    time.sleep(0.2)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        logger.error("rank process %d did not exit after kill", proc.pid)
            for log in logs:
                log.close()
        wall = time.monotonic() - started
        outcome: dict[str, Any] = {
            "wall_seconds": wall,
            "link": link_delta(before, link_counters(self.link)),
            "load_after": load_average(),
        }
        busy_after, own_after = machine_busy_seconds(), own_cpu_seconds()
        if busy_before is not None and busy_after is not None and wall > 0:
            other = (busy_after - busy_before) - (own_after - own_before)
            outcome["other_cpu_share"] = max(0.0, other) / (wall * (os.cpu_count() or 1))
        if error is not None:
            logger.error("%s FAILED: %s", method, error)
            logs_text = [
                f"rank {r}:\n{tail(run_dir / f'rank{r}.log', 25)}" for r in range(self.world_size)
            ]
            logger.error("last log lines:\n%s", "\n".join(logs_text))
            return {**outcome, "error": error, "log_tail": tail(run_dir / "rank0.log", 25)}
        results = [
            json.loads((run_dir / f"result-rank{r}.json").read_text(encoding="utf-8"))
            for r in range(self.world_size)
        ]
        if self.code_dir is not None:
            for result in results:
                for key in ("autocomp_path", "bench_path"):
                    if not result[key].startswith(str(self.code_dir)):
                        raise RuntimeError(f"a rank imported {result[key]}, not the snapshot")
        return {**outcome, "results": results}

    def run(self) -> dict[str, Any]:
        """Every method in turn; the rows and checks."""
        from autocomp_bench.tasks import build_task

        c = self.config
        task = build_task(c.task)
        numel = sum(p.numel() for p in task.build_model().parameters())
        timeout = self.timeout_s(4 * numel)
        problems = method_problems(c.ranks_per_node)
        descriptions = method_descriptions(c.nodes, c.ranks_per_node)
        rows = []
        for method in c.methods:
            print(f"   {method:<14} ...", end="", flush=True)
            if method in problems:
                outcome: dict[str, Any] = {"skipped": problems[method]}
            else:
                outcome = self.launch(method, timeout)
            row = summarize_method(method, descriptions[method], outcome, self.world_size)
            rows.append(row)
            if "skipped" in row:
                print(f" SKIPPED: {row['skipped']}", flush=True)
            elif "error" in row:
                print(f" FAILED: {row['error']}", flush=True)
            else:
                print(
                    f" {row['steps']} steps, median {row['median_step_s']:.4f} s/step, valid "
                    f"loss {row['valid_loss']:.4f}, link {row['link']['total'] / 1e6:.1f} MB, "
                    f"identical: {row['identical_detail'] if row['identical'] else 'NO'}, "
                    f"wall {row['wall_seconds']:.0f} s",
                    flush=True,
                )
        return {
            "task_description": task.description,
            "numel": numel,
            "timeout_s": timeout,
            "rows": rows,
            "checks": hier_checks(rows, self.world_size),
        }


# ---- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autocomp-bench hier",
        description="Nodes of gloo ranks in network namespaces (default two of two), "
        "tbf-shaped veths between them: DDP, PyTorch's fp16 and PowerSGD hooks, flat and "
        "hierarchical autocomp, HSDP plain and compressed, each trained for the same "
        "wall-clock budget.",
    )
    parser.add_argument("--task", default=DEFAULT_TASK, help="default: %(default)s")
    parser.add_argument(
        "--nodes",
        type=int,
        default=DEFAULT_NODES,
        metavar="N",
        help="network namespaces on the shaped link, >= 2 (default: %(default)s)",
    )
    parser.add_argument(
        "--ranks-per-node",
        type=int,
        default=DEFAULT_RANKS_PER_NODE,
        metavar="L",
        help="gloo ranks per node, >= 1; hier needs >= 2 (default: %(default)s)",
    )
    parser.add_argument(
        "--rate", default=DEFAULT_RATE, help="link rate between the nodes (default: %(default)s)"
    )
    parser.add_argument("--methods", default=",".join(METHODS), help="default: %(default)s")
    parser.add_argument(
        "--budget-s", type=float, default=40.0, help="training seconds per method (default: 40)"
    )
    parser.add_argument(
        "--evals", type=int, default=4, help="validation points before the end (default: 4)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--gloo-timeout", type=float, default=GLOO_TIMEOUT_S, help="gloo timeout in seconds"
    )
    parser.add_argument("--json", type=Path, default=None, help="write all results as JSON")
    parser.add_argument("--markdown", type=Path, default=None, help="write a markdown section")
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        metavar="JSON",
        help="run nothing: re-render the report (text, --markdown) of a saved --json",
    )
    return parser


def parse_config(argv: list[str]) -> tuple[argparse.Namespace, HierBenchmark.Config]:
    """Parsed arguments and the benchmark's config; exits with a usage error on bad values."""
    from autocomp_bench.tasks import TASKS

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.task not in TASKS:
        parser.error(f"--task: unknown {args.task!r}; choose from {', '.join(TASKS)}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        parser.error(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    if len(set(methods)) != len(methods):
        parser.error("--methods: a method is named twice")
    try:
        rate_mbit = parse_rate(args.rate)
    except ValueError as err:
        parser.error(f"--rate: {err}")
    if not (math.isfinite(args.budget_s) and args.budget_s > 0):
        parser.error("--budget-s must be > 0")
    if args.evals < 0 or args.threads < 1:
        parser.error("need --evals >= 0 and --threads >= 1")
    if args.nodes < 2:
        parser.error(f"--nodes must be >= 2 (the link joins nodes), got {args.nodes}")
    if args.ranks_per_node < 1:
        parser.error(f"--ranks-per-node must be >= 1, got {args.ranks_per_node}")
    if args.ranks_per_node < 2 and methods == ["hier"]:
        # It would only be skipped: a run that runs nothing is a mistake worth a usage error.
        parser.error(
            "--methods hier needs --ranks-per-node >= 2 (hierarchy=True reduces "
            "inside each node first)"
        )
    config = HierBenchmark.Config(
        task=args.task,
        methods=methods,
        nodes=args.nodes,
        ranks_per_node=args.ranks_per_node,
        rate=args.rate,
        rate_mbit=rate_mbit,
        budget_s=args.budget_s,
        evals=args.evals,
        threads=args.threads,
        gloo_timeout_s=args.gloo_timeout,
    )
    return args, config


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or re-render a saved one); 0 when every check passed, else 1."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args, config = parse_config(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.from_json is not None:
        document = json.loads(args.from_json.read_text(encoding="utf-8"))
        print("\n".join(text_report(document)))
        return _write_outputs(document, args)
    nodes, per_node = config.nodes, config.ranks_per_node
    reason = shaped_link_unavailable_reason()
    if reason is not None:
        print(
            f"autocomp-bench hier: cannot build the {count_word(nodes)} nodes: {reason}",
            file=sys.stderr,
        )
        return 2
    command = shlex.join(["autocomp-bench", "hier", *argv])
    print(f"autocomp {count_word(nodes)}-node benchmark: {command}", flush=True)
    exit_on_sigterm()
    started = time.monotonic()
    document: dict[str, Any] = {"benchmark": "autocomp_bench.hier", "command": command}
    document["machine"] = machine_info()
    document["machine"]["network"] = network_description(nodes, per_node)
    with tempfile.TemporaryDirectory(prefix="autocomp-hier-") as tmp:
        root = Path(tmp)
        code_dir, digest = snapshot_code(root)
        document["code_digest"] = digest
        link_config = ShapedLink.Config(hosts=nodes, rate_mbit=config.rate_mbit)
        with ShapedLink(link_config) as link:
            print(
                f"== {config.task} on {nodes} nodes x {per_node} ranks, link "
                f"{config.rate}, {config.budget_s:g} s per method",
                flush=True,
            )
            document.update(HierBenchmark(config, link, root, code_dir).run())
    document["settings"] = {**asdict(config), "target_overlap": TARGET_OVERLAP}
    document["runtime_s"] = time.monotonic() - started
    document["machine"]["load_average_after"] = load_average()
    document = jsonable(document)
    print()
    print("\n".join(text_report(document)), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return _write_outputs(document, args)


def network_description(nodes: int, ranks_per_node: int) -> str:
    """The document's ``machine.network`` line: how the namespaces are joined."""
    inside = "1 rank" if ranks_per_node == 1 else f"{ranks_per_node} ranks (loopback inside)"
    if nodes == 2:
        return (
            f"{nodes} network namespaces x {inside}, one veth pair between them with tc tbf "
            "on both ends (ShapedLink)"
        )
    return (
        f"{nodes} network namespaces x {inside}, each with a veth pair to a bridge in a hub "
        "namespace, tc tbf on both ends of every pair (ShapedLink)"
    )


def _write_outputs(document: dict[str, Any], args: argparse.Namespace) -> int:
    if args.markdown is not None:
        args.markdown.write_text(render_markdown(document), encoding="utf-8")
        print(f"wrote {args.markdown}")
    return 0 if all(c["passed"] for c in document["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
