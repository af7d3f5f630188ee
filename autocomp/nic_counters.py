"""Byte counters of the network interface torch.distributed uses: a cross-check of the link fit.

The :class:`~autocomp.link_model.BandwidthMeter` sees only this job's collectives; the
kernel's counters see *all* traffic on the interface, so a gap between the two shows
contention. This module finds the interface (from ``GLOO_SOCKET_IFNAME``,
``NCCL_SOCKET_IFNAME`` or the route to ``MASTER_ADDR``) and reads its counters. It only reads
counters and never sends traffic.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "NicCounters",
    "NicSample",
    "local_address_for",
    "rate_between",
    "resolve_interface",
]

logger = logging.getLogger(__name__)

_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True, slots=True)
class NicSample:
    """Kernel byte counters of one interface at one moment."""

    interface: str
    """Interface name, e.g. ``eth0``."""
    bytes_sent: int
    """Bytes sent since the counters started (psutil corrects 32-bit wrap-around)."""
    bytes_recv: int
    """Bytes received since the counters started."""
    time_s: float
    """``time.monotonic()`` when the counters were read."""


def _psutil() -> Any | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def _names_from_variable(value: str) -> list[str]:
    """Interface names or prefixes of a *_SOCKET_IFNAME value; an exclusion list gives none."""
    value = value.strip()
    if not value or value.startswith("^"):
        return []  # NCCL's "^docker,lo" excludes interfaces: it does not name the one in use
    return [part.strip().lstrip("=") for part in value.split(",") if part.strip().lstrip("=")]


def local_address_for(remote: str) -> str | None:
    """Local address of the route to ``remote`` (a numeric IP or ``localhost``), or None.

    A UDP socket's ``connect()`` only asks the kernel for a route; no packet leaves the host.
    Host names other than ``localhost`` are not resolved, because that could query DNS.
    """
    host = "127.0.0.1" if remote.strip().lower() == "localhost" else remote.strip().strip("[]")
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return None
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # port is irrelevant: nothing is sent
            return str(probe.getsockname()[0]).split("%")[0]
    except OSError:
        return None


def resolve_interface(environ: Mapping[str, str] | None = None) -> str | None:
    """Name of the interface torch.distributed traffic uses, or None if it cannot be told.

    Order: ``GLOO_SOCKET_IFNAME``, then ``NCCL_SOCKET_IFNAME`` (first name of a comma list; an
    NCCL-style prefix such as ``eth`` picks the first matching interface), then the interface
    holding the local address of the route to ``MASTER_ADDR``.
    """
    env = os.environ if environ is None else environ
    psutil = _psutil()
    if psutil is None:
        return None
    counters = psutil.net_io_counters(pernic=True)
    for variable in _IFNAME_VARIABLES:
        for name in _names_from_variable(env.get(variable, "")):
            if name in counters:
                return name
            matches = sorted(n for n in counters if n.startswith(name))
            if matches:
                return matches[0]
            logger.debug("%s names %r, which is not an interface of this host", variable, name)
    master = env.get("MASTER_ADDR")
    if not master:
        return None
    local = local_address_for(master)
    if local is None:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if str(entry.address).split("%")[0] == local:
                return name
    return None


class NicCounters:
    """Byte counters of the interface torch.distributed uses, as a cross-check of the meter.

    Unlike the meter, the counters see *all* traffic on the interface (other jobs, data
    loading), so a gap between the two shows contention. Reading them sends nothing.
    """

    def __init__(
        self, interface: str | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        """Watch ``interface``, or the one :func:`resolve_interface` finds in ``environ``."""
        self._psutil = _psutil()
        self._warned = False
        self.interface: str | None = None
        """Interface whose counters are read; None when unavailable."""
        if self._psutil is None:
            self._unavailable("psutil is not installed")
            return
        name = interface if interface is not None else resolve_interface(environ)
        if name is None:
            self._unavailable("could not tell which interface torch.distributed uses")
        elif name not in self._psutil.net_io_counters(pernic=True):
            self._unavailable(f"no interface named {name!r}")
        else:
            self.interface = name

    def _unavailable(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            logger.debug("NIC byte counters unavailable: %s", why)

    def sample(self) -> NicSample | None:
        """Current counters, or None when unavailable (the reason is logged once)."""
        if self._psutil is None or self.interface is None:
            return None
        counters = self._psutil.net_io_counters(pernic=True).get(self.interface)
        if counters is None:
            self._unavailable(f"interface {self.interface!r} disappeared")
            return None
        return NicSample(
            self.interface, int(counters.bytes_sent), int(counters.bytes_recv), time.monotonic()
        )

    def rate_since(
        self, previous: NicSample, direction: Literal["sent", "recv", "max"] = "sent"
    ) -> float | None:
        """Bytes per second since ``previous`` (sent by default, to compare with link_bytes).

        None when the counters are unavailable, no time has passed, or they went backwards.
        """
        current = self.sample()
        return None if current is None else rate_between(previous, current, direction)


def rate_between(
    first: NicSample, second: NicSample, direction: Literal["sent", "recv", "max"] = "sent"
) -> float | None:
    """Bytes per second between two samples of the same interface, or None if undefined."""
    elapsed = second.time_s - first.time_s
    if first.interface != second.interface or elapsed <= 0:
        return None
    sent = second.bytes_sent - first.bytes_sent
    recv = second.bytes_recv - first.bytes_recv
    if sent < 0 or recv < 0:
        return None  # counters were reset (interface re-created)
    moved = {"sent": sent, "recv": recv, "max": max(sent, recv)}[direction]
    return moved / elapsed
