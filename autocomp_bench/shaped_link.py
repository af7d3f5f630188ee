"""Emulate a slow network link between torch.distributed ranks, for real.

Gradient compression only pays off when the network is the bottleneck, so
tests and benchmarks need a link that is actually slow. Loopback is far too
fast, and mocking the transport would not exercise gloo's real TCP path.
This module builds a private network out of Linux network namespaces joined
by veth pairs, rate limits every host's egress with a ``tbf`` qdisc (``netem``
is not available on every kernel; ``tbf`` is), and runs one process per
namespace with ``ip netns exec``.

Topology:

* 2 hosts: one veth pair, host 0 <-> host 1, ``tbf`` on both ends.
* N > 2 hosts: a hub namespace holding a Linux bridge; each host has a veth
  pair to the hub. ``tbf`` sits on the host end (uplink) and on the hub end
  (downlink), so every port behaves like a full-duplex link of the given rate.

The network is fully isolated: it is not connected to the root namespace, so
addresses and ports cannot clash with anything else, including other
``ShapedLink`` instances using the same subnet. Only 10.0.0.0/8 subnets are
accepted. Needs root and iproute2 (``ip``, ``tc``); see
:func:`shaped_link_unavailable_reason`.
"""

from __future__ import annotations

import atexit
import functools
import ipaddress
import itertools
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "ShapedLink",
    "default_burst_bytes",
    "parse_rate",
    "shaped_link_unavailable_reason",
]

_ALLOWED_SUPERNET = ipaddress.ip_network("10.0.0.0/8")
_COMMAND_TIMEOUT_S = 30.0
_KILL_TIMEOUT_S = 5.0
# Largest frame tbf must let through: 1500 byte MTU + 14 byte Ethernet header.
_MAX_FRAME_BYTES = 1514
# Kernel HZ to size the default bucket for; 250 is common (and what this was
# developed on). A bucket holding rate/HZ bytes is tbf's documented minimum.
_ASSUMED_HZ = 250
# Floor for the default bucket: a full GSO super-packet on veth, so tbf does not
# have to segment in software at low rates.
_MIN_AUTO_BURST_BYTES = 64 * 1024

_instance_counter = itertools.count()
_live_links: set[ShapedLink] = set()
_live_links_lock = threading.Lock()


class ShapedLink:
    """Hosts in private network namespaces joined by rate-limited veth links.

    Use as a context manager (or call :meth:`start` and :meth:`close`)::

        with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=100)) as link:
            procs = [
                link.popen(h, [sys.executable, "train.py"],
                           env=link.rank_env(h, world_size=2, master_port=29500))
                for h in range(2)
            ]

    Namespaces are removed on :meth:`close`, on ``__exit__`` (also after an
    exception), if :meth:`start` fails halfway, and at interpreter exit.
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Shape of the emulated network."""

        hosts: int = 2
        """Number of host namespaces (one rank each); at least 2."""
        rate_mbit: float | None = None
        """Per-direction link rate in Mbit/s (10**6 bit/s); None = unshaped."""
        burst_bytes: int | None = None
        """tbf bucket size; None = max(rate/HZ for HZ=250, 64 KiB)."""
        latency_ms: float = 50.0
        """Longest a packet may wait in the tbf queue before being dropped."""
        subnet: str = "10.77.0.0/24"
        """Private subnet for host addresses; must lie inside 10.0.0.0/8."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._network = _validate_config(config)
        self._rate_mbit: float | None = config.rate_mbit
        self._namespaces: list[str] = []
        self._hub: str | None = None
        # Interface names only need to be unique inside each namespace.
        self._interfaces = [f"ac-h{i}" for i in range(config.hosts)]
        host_ips = itertools.islice(self._network.hosts(), config.hosts)
        self._addresses = [str(ip) for ip in host_ips]
        # (namespace, device) pairs carrying a tbf qdisc when shaped.
        self._shaped_devices: list[tuple[str, str]] = []
        self._created_namespaces: list[str] = []
        self._procs: list[subprocess.Popen[Any]] = []
        self._owner_pid: int | None = None
        self._started = False
        self._closed = False

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> ShapedLink:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Create the namespaces, links, addresses and qdiscs."""
        if self._started:
            raise RuntimeError("ShapedLink.start() called twice")
        if self._closed:
            raise RuntimeError("ShapedLink cannot be restarted after close()")
        self._started = True
        self._owner_pid = os.getpid()
        with _live_links_lock:
            _live_links.add(self)
        tag = f"ac{os.getpid()}n{next(_instance_counter)}"
        hosts = self._config.hosts
        self._namespaces = [f"{tag}h{i}" for i in range(hosts)]
        try:
            self._build(tag)
        except BaseException:
            logger.error("ShapedLink %s: setup failed, cleaning up", tag)
            try:
                self.close()
            except Exception:
                logger.exception("ShapedLink %s: cleanup after failed setup failed", tag)
            raise
        logger.info(
            "ShapedLink %s up: %d hosts %s, rate %s",
            tag,
            hosts,
            self._addresses,
            _describe_rate(self._rate_mbit),
        )

    def close(self) -> None:
        """Stop leftover processes and delete every namespace created. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with _live_links_lock:
            _live_links.discard(self)
        if self._owner_pid is not None and self._owner_pid != os.getpid():
            # A forked child must not tear down its parent's network.
            return
        for proc in self._procs:
            if proc.poll() is None:
                logger.warning("ShapedLink: killing leftover process %d", proc.pid)
                proc.kill()
                try:
                    proc.wait(timeout=_KILL_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    logger.error("ShapedLink: process %d did not exit", proc.pid)
        errors: list[str] = []
        for ns in reversed(self._created_namespaces):
            try:
                _run(["ip", "netns", "delete", ns])
            except RuntimeError as err:
                errors.append(str(err))
        self._created_namespaces.clear()
        if errors:
            raise RuntimeError("ShapedLink cleanup failed:\n" + "\n".join(errors))
        logger.debug("ShapedLink: namespaces %s removed", self._namespaces)

    # -- properties --------------------------------------------------------

    @property
    def config(self) -> Config:
        """The configuration this link was built from."""
        return self._config

    @property
    def addresses(self) -> list[str]:
        """IPv4 address of host i (without prefix length)."""
        return list(self._addresses)

    @property
    def interfaces(self) -> list[str]:
        """Interface name of host i inside its namespace (for GLOO_SOCKET_IFNAME)."""
        return list(self._interfaces)

    @property
    def namespaces(self) -> list[str]:
        """Network namespace name of host i (empty before start; excludes the hub)."""
        return list(self._namespaces)

    @property
    def hub_namespace(self) -> str | None:
        """Namespace holding the bridge (hosts > 2 only), else None."""
        return self._hub

    @property
    def rate_mbit(self) -> float | None:
        """Current per-direction rate in Mbit/s; None when unshaped."""
        return self._rate_mbit

    # -- operations --------------------------------------------------------

    def set_rate(self, rate_mbit: float | None) -> None:
        """Change the rate of every link while running; None removes shaping."""
        self._require_running()
        if rate_mbit is not None:
            _validate_rate(rate_mbit)
        if rate_mbit is None:
            if self._rate_mbit is not None:
                for ns, dev in self._shaped_devices:
                    _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"])
        else:
            for ns, dev in self._shaped_devices:
                self._apply_tbf(ns, dev, rate_mbit)
        self._rate_mbit = rate_mbit
        logger.info("ShapedLink: rate set to %s", _describe_rate(rate_mbit))

    def popen(
        self,
        host: int,
        argv: list[str],
        env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside host ``host``'s namespace.

        Unlike :class:`subprocess.Popen`, ``env`` is layered on top of the
        current environment rather than replacing it, so ``env=rank_env(...)``
        keeps PATH and friends. Other keyword arguments go to Popen unchanged.
        Processes still running at :meth:`close` are killed.
        """
        self._require_running()
        self._check_host(host)
        full_env = dict(os.environ)
        if env is not None:
            full_env.update(env)
        cmd = ["ip", "netns", "exec", self._namespaces[host], *argv]
        logger.debug("ShapedLink: host %d: %s", host, shlex.join(argv))
        proc: subprocess.Popen[Any] = subprocess.Popen(cmd, env=full_env, **kwargs)
        self._procs.append(proc)
        return proc

    def rank_env(self, host: int, world_size: int, master_port: int) -> dict[str, str]:
        """torch.distributed env:// variables for the rank running on ``host``.

        Rank = host index; each namespace is its own machine (LOCAL_RANK 0).
        """
        self._require_running()
        self._check_host(host)
        if not host < world_size <= self._config.hosts:
            raise ValueError(
                f"world_size must satisfy host < world_size <= hosts "
                f"(host={host}, world_size={world_size}, hosts={self._config.hosts})"
            )
        if not 0 < master_port < 65536:
            raise ValueError(f"master_port out of range: {master_port}")
        return {
            "MASTER_ADDR": self._addresses[0],
            "MASTER_PORT": str(master_port),
            "RANK": str(host),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "GLOO_SOCKET_IFNAME": self._interfaces[host],
        }

    # -- internals ---------------------------------------------------------

    def _require_running(self) -> None:
        if not self._started or self._closed:
            raise RuntimeError("ShapedLink is not running (use start() or a with block)")

    def _check_host(self, host: int) -> None:
        if not 0 <= host < self._config.hosts:
            raise ValueError(f"host must be in [0, {self._config.hosts}), got {host}")

    def _add_namespace(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._created_namespaces.append(ns)
        _ip(ns, "link", "set", "lo", "up")

    def _build(self, tag: str) -> None:
        for ns in self._namespaces:
            self._add_namespace(ns)
        if self._config.hosts == 2:
            ns0, ns1 = self._namespaces
            if0, if1 = self._interfaces
            _ip(ns0, "link", "add", if0, "type", "veth", "peer", "name", if1, "netns", ns1)
            self._shaped_devices = [(ns0, if0), (ns1, if1)]
        else:
            hub = f"{tag}hub"
            self._add_namespace(hub)
            self._hub = hub
            _ip(hub, "link", "add", "ac-br", "type", "bridge")
            _ip(hub, "link", "set", "ac-br", "addrgenmode", "none")
            for i, (ns, dev) in enumerate(zip(self._namespaces, self._interfaces, strict=True)):
                port = f"ac-p{i}"
                _ip(hub, "link", "add", port, "type", "veth", "peer", "name", dev, "netns", ns)
                _ip(hub, "link", "set", port, "addrgenmode", "none")
                _ip(hub, "link", "set", port, "master", "ac-br")
                _ip(hub, "link", "set", port, "up")
                self._shaped_devices += [(ns, dev), (hub, port)]
            _ip(hub, "link", "set", "ac-br", "up")
        prefix = self._network.prefixlen
        for ns, dev, addr in zip(self._namespaces, self._interfaces, self._addresses, strict=True):
            # No IPv6 link-local address: keeps the link quiet and makes gloo
            # pick the IPv4 address for GLOO_SOCKET_IFNAME.
            _ip(ns, "link", "set", dev, "addrgenmode", "none")
            _ip(ns, "addr", "add", f"{addr}/{prefix}", "dev", dev)
            _ip(ns, "link", "set", dev, "up")
        if self._rate_mbit is not None:
            for ns, dev in self._shaped_devices:
                self._apply_tbf(ns, dev, self._rate_mbit)

    def _apply_tbf(self, ns: str, dev: str, rate_mbit: float) -> None:
        burst = self._config.burst_bytes
        if burst is None:
            burst = default_burst_bytes(rate_mbit)
        latency_us = max(1, round(self._config.latency_ms * 1000))
        rate_bit = max(1, round(rate_mbit * 1e6))
        tbf = ["tbf", "rate", f"{rate_bit}bit", "burst", str(burst), "latency", f"{latency_us}us"]
        _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *tbf])


def default_burst_bytes(rate_mbit: float) -> int:
    """tbf bucket size used when ``Config.burst_bytes`` is None.

    tbf can only release what fits in its bucket per timer wakeup, so the
    bucket must hold at least rate/HZ bytes or the configured rate is never
    reached; it must also exceed the largest frame or that frame is dropped.
    64 KiB covers both at low rates and holds a whole veth GSO packet.
    Measured on veth (HZ=250): a 3 KB bucket reached only ~75% of 1 Gbit/s and
    ~85-90% of 50 Mbit/s; this default reaches ~96-98% (TCP goodput) from
    50 Mbit/s to 1 Gbit/s.
    """
    per_tick = math.ceil(rate_mbit * 1e6 / 8 / _ASSUMED_HZ)
    return max(per_tick, _MIN_AUTO_BURST_BYTES)


def _validate_rate(rate_mbit: float) -> None:
    if isinstance(rate_mbit, bool) or not isinstance(rate_mbit, int | float):
        raise TypeError(f"rate_mbit must be a number or None, got {rate_mbit!r}")
    if not math.isfinite(rate_mbit) or rate_mbit <= 0:
        raise ValueError(f"rate_mbit must be a positive finite number, got {rate_mbit!r}")
    if rate_mbit * 1e6 < 8:
        raise ValueError(f"rate_mbit too small for tc (< 8 bit/s): {rate_mbit!r}")


def _validate_config(config: ShapedLink.Config) -> ipaddress.IPv4Network:
    if isinstance(config.hosts, bool) or not isinstance(config.hosts, int) or config.hosts < 2:
        raise ValueError(f"hosts must be an int >= 2, got {config.hosts!r}")
    if config.rate_mbit is not None:
        _validate_rate(config.rate_mbit)
    if config.burst_bytes is not None and config.burst_bytes < 2 * _MAX_FRAME_BYTES:
        raise ValueError(
            f"burst_bytes must be >= {2 * _MAX_FRAME_BYTES} (two full frames), "
            f"got {config.burst_bytes}"
        )
    if not (math.isfinite(config.latency_ms) and config.latency_ms > 0):
        raise ValueError(f"latency_ms must be positive, got {config.latency_ms!r}")
    try:
        network = ipaddress.ip_network(config.subnet, strict=True)
    except ValueError as err:
        raise ValueError(f"invalid subnet {config.subnet!r}: {err}") from err
    if not isinstance(network, ipaddress.IPv4Network) or not network.subnet_of(_ALLOWED_SUPERNET):
        raise ValueError(f"subnet must lie inside 10.0.0.0/8, got {config.subnet!r}")
    usable = network.num_addresses - 2
    if usable < config.hosts:
        raise ValueError(f"subnet {config.subnet} has {usable} host addresses, need {config.hosts}")
    return network


def _ip(ns: str, *args: str) -> str:
    """Run ``ip -n NS ARGS...`` (see :func:`_run`)."""
    return _run(["ip", "-n", ns, *args])


def _run(cmd: list[str]) -> str:
    """Run an iproute2 command; raise RuntimeError with command and stderr on failure."""
    logger.debug("run: %s", shlex.join(cmd))
    try:
        result = subprocess.run(
            cmd, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"command failed: {shlex.join(cmd)}: {err}") from err
    if result.returncode != 0:
        stderr = result.stderr.strip() or "(no stderr)"
        raise RuntimeError(
            f"command failed with exit code {result.returncode}: {shlex.join(cmd)}: {stderr}"
        )
    return result.stdout


def _describe_rate(rate_mbit: float | None) -> str:
    return "unshaped" if rate_mbit is None else f"{rate_mbit:g} Mbit/s"


@functools.cache
def shaped_link_unavailable_reason() -> str | None:
    """Why a ShapedLink cannot be built here, or None if it can.

    Checks the platform, root, ``ip`` and ``tc``, then builds and removes a
    real 2-host shaped link once. The answer is cached for the process.
    """
    if not sys.platform.startswith("linux"):
        return f"needs Linux network namespaces (platform is {sys.platform})"
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"needs iproute2 ({' and '.join(missing)} not found on PATH)"
    try:
        with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=10.0)):
            pass
    except RuntimeError as err:
        return f"cannot create a namespace with a tbf qdisc: {err}"
    return None


_RATE_RE = re.compile(
    r"^\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[kmgt]?)bits?(?:/s)?\s*$",
    re.IGNORECASE,
)
_RATE_UNIT_BIT = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_UNSHAPED_WORDS = frozenset({"unshaped", "none", "off"})
_RATE_EXAMPLES = '"50mbit", "1gbit", "12.5Mbit/s", "800kbit", "unshaped"'


def parse_rate(text: str) -> float | None:
    """Parse a link rate into Mbit/s (10**6 bit/s), as taken by ``set_rate``.

    Accepts a positive number with a bit unit (bit, kbit, mbit, gbit, tbit;
    case-insensitive; optional "/s" suffix, e.g. "50Mbit/s"), or
    "unshaped"/"none"/"off", which return None. Bare numbers and byte units
    ("mbps", "MB/s") are rejected as ambiguous.
    """
    if not isinstance(text, str):
        raise TypeError(f"rate must be a string, got {type(text).__name__}")
    if text.strip().lower() in _UNSHAPED_WORDS:
        return None
    match = _RATE_RE.match(text)
    if match is None:
        raise ValueError(f"invalid rate {text!r}; expected e.g. {_RATE_EXAMPLES}")
    mbit = float(match["num"]) * _RATE_UNIT_BIT[match["unit"].lower()] / 1e6
    if not math.isfinite(mbit) or mbit <= 0:
        raise ValueError(
            f"rate must be positive and finite, got {text!r}; expected e.g. {_RATE_EXAMPLES}"
        )
    return mbit


@atexit.register
def _close_live_links() -> None:
    with _live_links_lock:
        links = list(_live_links)
    for link in links:
        try:
            link.close()
        except Exception:
            logger.exception("ShapedLink: cleanup at exit failed")
