"""Run two training ranks as separate processes over a real link, and collect their results.

The multi-rank benchmarks (``autocomp-bench link``, ``tta``, ``advisor``) and ``make demo``
share this harness. Each run is two worker processes (:mod:`autocomp_bench.worker`), one per
host of a :class:`Network`: as root, two network namespaces joined by a ``tc tbf``-shaped veth
pair (:class:`ShapedNetwork`, the real thing); otherwise both on loopback, unshaped
(:class:`LoopbackNetwork`). :class:`Runner` writes a run's config, starts and watches the
ranks, and returns rank 0's result (plus rank 1's step times and how busy the machine was).
:func:`snapshot_code` freezes the code the workers import, so a long benchmark measures one
version even if the tree is edited while it runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from autocomp_bench.machine import (
    load_average,
    machine_busy_seconds,
    machine_info,
    own_cpu_seconds,
    tail,
)
from autocomp_bench.shaped_link import ShapedLink, parse_rate, shaped_link_unavailable_reason

logger = logging.getLogger(__name__)

__all__ = [
    "GLOO_TIMEOUT_S",
    "SEED",
    "WORLD_SIZE",
    "LoopbackNetwork",
    "Network",
    "Rate",
    "Runner",
    "ShapedNetwork",
    "exit_on_sigterm",
    "machine_summary",
    "open_network",
    "parse_rates",
    "snapshot_code",
    "worker_pythonpath",
]

WORLD_SIZE = 2
GLOO_TIMEOUT_S = 300.0
SEED = 0
"""Seed of every run's model and batches: every method starts from the same weights."""
WORKER_MODULE = "autocomp_bench.worker"
"""Module the ranks run (``python -m WORKER_MODULE CONFIG``)."""


# ---- link settings ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rate:
    """One link setting: its label as given and its rate in Mbit/s (None = unshaped)."""

    label: str
    mbit: float | None

    @property
    def sort_key(self) -> float:
        return math.inf if self.mbit is None else self.mbit


def parse_rates(text: str) -> list[Rate]:
    """``"10mbit,200mbit,unshaped"`` -> rates in the given order; ValueError if none or bad."""
    rates = []
    for token in text.split(","):
        token = token.strip()
        if token:
            rates.append(Rate(token, parse_rate(token)))
    if not rates:
        raise ValueError("no rates given")
    return rates


# ---- networks --------------------------------------------------------------------------------


class Network(Protocol):
    kind: str

    def popen(self, host: int, argv: list[str], env: dict[str, str], **kw: Any) -> Any: ...

    def env(self, host: int, port: int) -> dict[str, str]: ...

    def set_rate(self, rate_mbit: float | None) -> None: ...


class ShapedNetwork:
    """Two namespaces on a tbf-shaped veth pair (the real thing)."""

    kind = "shaped"

    def __init__(self, link: ShapedLink) -> None:
        self.link = link

    def popen(self, host: int, argv: list[str], env: dict[str, str], **kw: Any) -> Any:
        return self.link.popen(host, argv, env=env, **kw)

    def env(self, host: int, port: int) -> dict[str, str]:
        return self.link.rank_env(host, world_size=WORLD_SIZE, master_port=port)

    def set_rate(self, rate_mbit: float | None) -> None:
        if self.link.rate_mbit != rate_mbit:
            self.link.set_rate(rate_mbit)


class LoopbackNetwork:
    """Fallback without root: both ranks on loopback, unshaped."""

    kind = "loopback"

    def popen(self, host: int, argv: list[str], env: dict[str, str], **kw: Any) -> Any:
        return subprocess.Popen(argv, env={**os.environ, **env}, **kw)

    def env(self, host: int, port: int) -> dict[str, str]:
        return {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(host),
            "WORLD_SIZE": str(WORLD_SIZE),
            "LOCAL_RANK": str(host),
            "LOCAL_WORLD_SIZE": str(WORLD_SIZE),
            "GLOO_SOCKET_IFNAME": "lo",
        }

    def set_rate(self, rate_mbit: float | None) -> None:
        if rate_mbit is not None:
            raise RuntimeError("the loopback fallback cannot shape the link")


NETWORK_CHOICES = ("auto", "shaped", "loopback")


def add_network_option(parser: argparse.ArgumentParser) -> None:
    """The benchmarks' ``--network`` option (:func:`choose_network` reads it)."""
    parser.add_argument(
        "--network",
        choices=NETWORK_CHOICES,
        default="auto",
        help="auto: the shaped link when root and iproute2 allow, else loopback (unshaped only)",
    )


def choose_network(choice: str, parser: argparse.ArgumentParser) -> tuple[bool, str | None]:
    """(whether to use the shaped link, why it cannot be built here or None) for a
    ``--network`` ``choice``; a usage error when ``shaped`` was asked for and cannot be had."""
    reason = shaped_link_unavailable_reason()
    if choice == "shaped" and reason is not None:
        parser.error(f"--network shaped: {reason}")
    return choice != "loopback" and reason is None, reason


@contextmanager
def open_network(shaped: bool) -> Iterator[Network]:
    """A :class:`ShapedNetwork` (unshaped until a rate is set) or a :class:`LoopbackNetwork`."""
    if shaped:
        with ShapedLink(ShapedLink.Config(hosts=WORLD_SIZE, rate_mbit=None)) as link:
            yield ShapedNetwork(link)
    else:
        yield LoopbackNetwork()


def machine_summary(network: Network, threads: int) -> dict[str, Any]:
    """:func:`~autocomp_bench.machine.machine_info` plus how the ranks ran."""
    import torch

    info = machine_info()
    info["torch_threads_per_rank"] = threads
    info["backend"] = "gloo"
    info["network"] = (
        "2 network namespaces, veth pair, tc tbf on both ends (ShapedLink)"
        if network.kind == "shaped"
        else "loopback, unshaped (shaped link unavailable)"
    )
    info["torch"] = torch.__version__
    return info


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so a killed benchmark still kills its workers and removes
    its namespaces and temporary files on the way out."""

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- code snapshot ---------------------------------------------------------------------------


def code_source() -> str:
    """The checkout the imported autocomp comes from (the folder holding the package).

    Reports print it beside the code digest: an A/B of two trees is only one when each
    arm's report names its own tree. ``python -m`` puts the working directory ahead of
    PYTHONPATH, so ``cd main && PYTHONPATH=other python -m autocomp_bench.cli`` runs main's
    code (forty-eighth session: two A/Bs of 36 runs measured one tree twice)."""
    import autocomp

    return str(Path(autocomp.__file__).resolve().parent.parent)


def snapshot_code(root: Path) -> tuple[Path, str]:
    """Copy autocomp (with its policy presets) and autocomp_bench to ``root``; (dir, digest).

    Workers import both packages from this copy (PYTHONPATH comes before the editable
    install's finder), so every run of one benchmark measures the same code even if the source
    tree is edited while it runs. The digest (sha256 over the .py and .toml files of both)
    names that code.
    """
    import autocomp
    import autocomp_bench
    from autocomp.policy.rules import presets_dir

    target = root / "code"
    for package in (autocomp, autocomp_bench):
        source = Path(package.__file__).resolve().parent
        shutil.copytree(source, target / source.name, ignore=shutil.ignore_patterns("__pycache__"))
    presets = presets_dir()
    policies = target / "autocomp" / "policies"
    if presets is not None and not policies.exists():
        policies.mkdir()
        for entry in presets.iterdir():
            if entry.name.endswith(".toml") or entry.name == "__init__.py":
                (policies / entry.name).write_bytes(entry.read_bytes())
    digest = hashlib.sha256()
    for path in sorted(target.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".toml"):
            digest.update(str(path.relative_to(target)).encode())
            digest.update(path.read_bytes())
    return target, digest.hexdigest()[:16]


def worker_pythonpath(code_dir: Path | None, environ: Mapping[str, str] = os.environ) -> str:
    """PYTHONPATH for a worker: the code snapshot first, then the caller's own entries, made
    absolute. Workers start in their run directory (inside a namespace), where a relative
    entry names nothing: ``PYTHONPATH=docs/x autocomp-bench tta --tasks extra`` found the
    extra task in the parent and failed every run with "unknown task" in the workers."""
    entries = [str(code_dir)] if code_dir is not None else []
    entries += [
        os.path.abspath(entry) for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry
    ]
    return os.pathsep.join(entries)


# ---- runs ------------------------------------------------------------------------------------


class Runner:
    """Starts the two ranks of one run, watches them, and collects rank 0's result."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        gloo_timeout_s: float = GLOO_TIMEOUT_S
        """Passed to the workers' ``init_process_group``: how long a collective may wait."""
        code_dir: Path | None = None
        """A :func:`snapshot_code` directory the workers import from (None: the installed
        packages); the runner checks that they did."""

    def __init__(self, network: Network, root: Path, config: Config | None = None) -> None:
        self.network = network
        self.root = root
        self.config = config if config is not None else Runner.Config()
        self.count = 0
        # Each namespace pair is a private network: a fresh port per run avoids TIME_WAIT.
        self.port = 29500

    def run(
        self,
        name: str,
        cfg: dict[str, Any],
        timeout_s: float,
        monitor: Callable[[Path], None] | None = None,
    ) -> dict[str, Any]:
        """Run both ranks with the worker config ``cfg``; rank 0's result or ``{"error": ...}``.

        ``monitor(run_dir)`` is called every 0.2 s while the ranks run (the drop scenario
        changes the link from it).
        """
        self.count += 1
        run_dir = self.root / f"run{self.count:02d}-{name}"
        run_dir.mkdir(parents=True)
        cfg = {**cfg, "run_dir": str(run_dir), "gloo_timeout_s": self.config.gloo_timeout_s}
        config_path = run_dir / "config.json"
        config_path.write_text(json.dumps(cfg), encoding="utf-8")
        if self.network.kind == "loopback":
            port = _free_port()
        else:
            self.port += 1
            port = self.port
        argv = [sys.executable, "-m", WORKER_MODULE, str(config_path)]
        extra = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(cfg["threads"])}
        code_dir = self.config.code_dir
        pythonpath = worker_pythonpath(code_dir)
        if pythonpath:
            extra["PYTHONPATH"] = pythonpath
        procs: list[Any] = []
        logs = []
        error: str | None = None
        started = time.monotonic()
        busy_before, own_before = machine_busy_seconds(), own_cpu_seconds()
        load_before = load_average()
        try:
            for host in range(WORLD_SIZE):
                log = open(run_dir / f"rank{host}.log", "w", encoding="utf-8")  # noqa: SIM115
                logs.append(log)
                env = {**self.network.env(host, port), **extra}
                procs.append(
                    self.network.popen(
                        host, argv, env, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir
                    )
                )
            while True:
                codes = [p.poll() for p in procs]
                if monitor is not None:
                    monitor(run_dir)
                if all(c == 0 for c in codes):
                    break
                failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    error = ", ".join(f"rank {r} exited with {c}" for r, c in failed)
                    break
                if time.monotonic() - started > timeout_s:
                    error = f"timed out after {timeout_s:.0f} s"
                    break
                time.sleep(0.2)
        except BaseException as err:
            error = f"{type(err).__name__}: {err}"
            raise
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        logger.error("worker %d did not exit after kill", proc.pid)
            for log in logs:
                log.close()
            if error is not None:
                logger.error("run %s FAILED: %s", name, error)
                for host in range(len(logs)):
                    logger.error(
                        "rank %d log (last lines):\n%s", host, tail(run_dir / f"rank{host}.log", 25)
                    )
        wall = time.monotonic() - started
        busy_after, own_after = machine_busy_seconds(), own_cpu_seconds()
        cpus = os.cpu_count() or 1
        other_cpu = None
        if busy_before is not None and busy_after is not None and wall > 0:
            other = (busy_after - busy_before) - (own_after - own_before)
            other_cpu = max(0.0, other) / (wall * cpus)
        load = {
            "load_before": load_before,
            "load_after": load_average(),
            "other_cpu_share": other_cpu,
        }
        if error is not None:
            return {
                "error": error,
                "wall_seconds": wall,
                "log_tail": tail(run_dir / "rank0.log"),
                **load,
            }
        result: dict[str, Any] = json.loads((run_dir / "result-rank0.json").read_text())
        peer = json.loads((run_dir / "result-rank1.json").read_text())
        if code_dir is not None:
            for key in ("autocomp_path", "bench_path"):
                if not result[key].startswith(str(code_dir)):
                    raise RuntimeError(
                        f"worker imported {result[key]} ({key}), not the snapshot {code_dir}"
                    )
        result["rank1_step_times"] = peer["step_times"]
        result["rank1_bytes_per_step"] = peer["bytes_per_step"]
        result["wall_seconds"] = wall
        result.update(load)
        return result
