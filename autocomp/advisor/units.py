"""Parsing and printing of link rates, latencies, sizes and durations for the advisor.

What-if values come from a command line, where ``10Gbit`` and ``10GB/s`` differ by a factor of
eight and a bare ``10`` means nothing; so every value needs a unit, and the parsers reject what
is not a plausible link (zero, negative, or beyond 100 Tbit/s) with a message that shows the
accepted spellings. Internally everything is SI: bytes per second and seconds.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "MAX_BANDWIDTH_BITS",
    "MAX_LATENCY_S",
    "MIN_BANDWIDTH_BITS",
    "format_bandwidth",
    "format_bytes",
    "format_seconds",
    "parse_bandwidth",
    "parse_latency",
]

MAX_BANDWIDTH_BITS = 100e12
"""Largest what-if bandwidth accepted (100 Tbit/s): above it, the value is surely a typo."""
MIN_BANDWIDTH_BITS = 1e3
"""Smallest what-if bandwidth accepted (1 kbit/s): below it no gradient exchange is plausible."""
MAX_LATENCY_S = 10.0
"""Largest what-if latency per hop accepted (10 s)."""

_NUMBER = r"(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_RATE = re.compile(_NUMBER + r"\s*(?P<unit>[A-Za-z/]*)\s*$")
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BIT_SUFFIXES = ("b", "b/s", "bps")
_BIT_WORDS = ("bit", "bits", "bit/s", "bits/s")
_BYTE_SUFFIXES = ("B", "B/s", "Bps")
_BYTE_WORDS = ("byte", "bytes", "byte/s", "bytes/s")
_LATENCY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

BANDWIDTH_HELP = "e.g. 50Mbit, 10Gbit/s, 400Gbps (bits) or 1.25GB/s (bytes)"
LATENCY_HELP = "e.g. 2ms, 50us, 0.001s"


def _rate_unit(unit: str) -> float | None:
    """Bytes per second per unit of ``unit`` (None if not a rate unit we know).

    Capital ``B`` is bytes and ``b`` or ``bit`` is bits (``10GB/s`` is eight times ``10Gb/s``),
    as network people write them; the prefix is decimal and case-insensitive.
    """
    prefix, rest = "", unit
    if len(unit) > 1 and unit[0].lower() in "kmgt":
        prefix, rest = unit[0].lower(), unit[1:]
    if rest in _BYTE_SUFFIXES or rest.lower() in _BYTE_WORDS:
        return _PREFIX[prefix]
    if rest in _BIT_SUFFIXES or rest.lower() in _BIT_WORDS:
        return _PREFIX[prefix] / 8.0
    return None


def parse_bandwidth(text: str) -> float:
    """``"10Gbit"`` -> 1.25e9 bytes/s. Raises ValueError saying what is accepted."""
    match = _RATE.match(text.strip())
    if match is None:
        raise ValueError(f"cannot read bandwidth {text!r}: {BANDWIDTH_HELP}")
    number = float(match["number"])
    scale = _rate_unit(match["unit"])
    if scale is None:
        what = "needs a unit" if not match["unit"] else f"has an unknown unit {match['unit']!r}"
        raise ValueError(f"bandwidth {text!r} {what}: {BANDWIDTH_HELP}")
    value = number * scale
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"bandwidth must be > 0, got {text!r}")
    if value * 8 < MIN_BANDWIDTH_BITS:
        raise ValueError(
            f"bandwidth {text!r} is below {format_bandwidth(MIN_BANDWIDTH_BITS / 8)}; "
            "is the unit right?"
        )
    if value * 8 > MAX_BANDWIDTH_BITS:
        raise ValueError(
            f"bandwidth {text!r} is above {format_bandwidth(MAX_BANDWIDTH_BITS / 8)}; "
            "is the unit right?"
        )
    return value


def parse_latency(text: str) -> float:
    """``"2ms"`` -> 0.002 seconds per hop; 0 is allowed, negative values are not."""
    match = re.match(_NUMBER + r"\s*(?P<unit>[A-Za-zµ]*)\s*$", text.strip())
    if match is None:
        raise ValueError(f"cannot read latency {text!r}: {LATENCY_HELP}")
    unit = match["unit"]
    if unit not in _LATENCY_UNITS:
        what = "needs a unit" if not unit else f"has an unknown unit {unit!r}"
        raise ValueError(f"latency {text!r} {what}: {LATENCY_HELP}")
    value = float(match["number"]) * _LATENCY_UNITS[unit]
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"latency must be >= 0, got {text!r}")
    if value > MAX_LATENCY_S:
        raise ValueError(
            f"latency {text!r} is above {MAX_LATENCY_S:g} s per hop; is the unit right?"
        )
    return value


def format_bandwidth(bytes_per_s: float) -> str:
    """Bytes/s as the bit rate people quote for links: ``1.25e9`` -> ``10 Gbit/s``."""
    bits = bytes_per_s * 8
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.3g} bit/s"


def format_bytes(size: float) -> str:
    """Decimal units (MB = 10^6 bytes), as in the rest of autocomp's reports."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(size) >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size:.0f} B"


def format_seconds(seconds: float) -> str:
    """Human scale: ``0.0123`` -> ``12.3 ms``."""
    if not math.isfinite(seconds):
        return str(seconds)
    magnitude = abs(seconds)
    if magnitude >= 1:
        return f"{seconds:.3g} s"
    if magnitude >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    if magnitude >= 1e-6 or magnitude == 0:
        return f"{seconds * 1e6:.3g} us"
    return f"{seconds * 1e9:.3g} ns"
