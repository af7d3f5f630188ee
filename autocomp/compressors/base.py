"""The compressor contract, spec strings and the registry.

A compressor turns one layer's gradient into a flat payload, says how many bytes that payload
puts on the wire and which collective can carry it, and turns payloads back into a gradient.
It holds configuration only: everything that changes from step to step (warm-start factors,
random generators, step counters) lives in a per-layer ``state`` dict owned by the hook, so one
compressor instance can serve many layers and the whole state can be checkpointed.

Contract used by the hook, per step and per layer::

    payload = c.compress(x, state)              # x: float32, the layer's shape, contiguous
    approx = c.decompress(payload, x.shape, state)   # local estimate (for error feedback)
    ... collective over payloads ...
    mean = c.decompress(summed_payload, ...)     # all-reduce: payloads are summable
    mean = c.decompress_sum(gathered, ...)       # all-gather: one payload per rank
    c.commit(summed_or_gathered, state)         # advance per-layer state, once per step

A compressor may need more than one collective per step (``rounds_for(shape) > 1``: PowerSGD
sends P, then Q computed from the summed P). Each later round's payload is computed from the
previous round's received result with ``compress_round(x, round, received, state)``; only the
last round's payload is decoded, and error feedback and ``commit`` act on it. Every round is
an all-reduce. :func:`run_rounds_locally` runs all rounds for one rank (tests, replays).

The hook divides every gradient by the world size before compressing, so the sum over ranks of
the decompressed payloads is already the average. In the hot path it calls two methods whose
defaults are built from the above and which a compressor may fuse to save passes over the
gradient: ``subtract_estimate_(x, payload, state)`` (error feedback, in place) and
``decompress_into(received, out, shape, state)`` (decode straight into the bucket buffer).
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

__all__ = [
    "Collective",
    "Compressor",
    "Param",
    "available_compressors",
    "build_compressor",
    "register_compressor",
    "run_rounds_locally",
]


class Collective(enum.Enum):
    """Which collective carries a payload."""

    ALL_REDUCE = "all_reduce"
    """Payloads are summable: the sum of payloads decompresses to the sum of gradients."""
    ALL_GATHER = "all_gather"
    """Payloads are opaque bytes: every rank receives every payload and decodes each."""


_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True, slots=True)
class Param:
    """One tunable parameter of a compressor, with its type, default and valid range."""

    name: str
    """Key used in spec strings, e.g. ``ratio`` in ``topk:ratio=0.01``."""
    kind: type
    """``int``, ``float`` or ``bool``."""
    default: int | float | bool
    """Value used when the spec omits the parameter."""
    low: float | None = None
    """Smallest valid value (inclusive unless ``low_open``)."""
    high: float | None = None
    """Largest valid value (inclusive)."""
    low_open: bool = False
    """True when ``low`` itself is not valid (e.g. a ratio must be > 0)."""
    doc: str = ""
    """One line for error messages and docs."""

    def describe(self) -> str:
        if self.kind is bool:
            return f"{self.name}=true|false (default {str(self.default).lower()})"
        lo = "" if self.low is None else f"{self.low}{' <' if self.low_open else ' <='} "
        hi = "" if self.high is None else f" <= {self.high}"
        return f"{self.name}: {self.kind.__name__}, {lo}{self.name}{hi} (default {self.default})"

    def coerce(self, raw: Any, owner: str) -> int | float | bool:
        """Parse and range-check one value; raise ValueError naming the valid range."""
        where = f"compressor '{owner}' parameter '{self.name}'"
        if self.kind is bool:
            if isinstance(raw, bool):
                return raw
            word = str(raw).strip().lower()
            if word not in _BOOL_WORDS:
                raise ValueError(f"{where}: expected true or false, got {raw!r}")
            return _BOOL_WORDS[word]
        try:
            if self.kind is int:
                if isinstance(raw, float) and not raw.is_integer():
                    raise ValueError
                value: int | float = int(str(raw).strip()) if isinstance(raw, str) else int(raw)
            else:
                value = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected {self.kind.__name__}, got {raw!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{where}: must be finite, got {raw!r}")
        too_low = self.low is not None and (
            value <= self.low if self.low_open else value < self.low
        )
        too_high = self.high is not None and value > self.high
        if too_low or too_high:
            raise ValueError(f"{where}={raw!r} is out of range; valid: {self.describe()}")
        return value


def _format_value(value: int | float | bool) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


class Compressor(ABC):
    """Base class: configuration of one compression scheme (stateless; see module docstring)."""

    name: ClassVar[str]
    """Registry key used in spec strings."""
    collective: ClassVar[Collective]
    """Collective the payload needs."""
    params: ClassVar[tuple[Param, ...]] = ()
    """Tunable parameters, in canonical order."""

    def __init__(self, **values: Any) -> None:
        known = {p.name: p for p in self.params}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(
                f"compressor '{self.name}' has no parameter {', '.join(map(repr, unknown))}; "
                f"valid: {self._valid_params()}"
            )
        self.config: dict[str, int | float | bool] = {
            p.name: p.coerce(values[p.name], self.name) if p.name in values else p.default
            for p in self.params
        }

    @classmethod
    def _valid_params(cls) -> str:
        return "; ".join(p.describe() for p in cls.params) or "none (takes no parameters)"

    @property
    def spec(self) -> str:
        """Canonical spec string: every parameter spelled out, so equal specs mean equal math."""
        if not self.params:
            return self.name
        body = ",".join(f"{k}={_format_value(v)}" for k, v in self.config.items())
        return f"{self.name}:{body}"

    @property
    def biased(self) -> bool:
        """True when E[decompress(compress(x))] != x; such compressors run with error feedback."""
        return True

    @property
    def error_feedback(self) -> bool:
        """Whether the hook keeps a residual for this compressor (``ef`` parameter, if any)."""
        return bool(self.config.get("ef", False))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compressor) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self.spec)

    # ---- sizes -----------------------------------------------------------------------------

    @abstractmethod
    def wire_bytes(
        self, shape: torch.Size, dtype: torch.dtype, state: dict[str, Any] | None = None
    ) -> int:
        """Exact bytes one rank hands to collectives per step for a tensor of ``shape``, all
        rounds together (``state`` is accepted for compressors whose size depends on it)."""

    def rounds_for(self, shape: torch.Size) -> int:
        """Collectives this compressor needs per step for a tensor of ``shape`` (>= 1)."""
        return 1

    def sends_as_is(self, shape: torch.Size) -> bool:
        """True when this compressor cannot compress a tensor of ``shape`` and would send it
        whole (PowerSGD on a 1-D tensor). The hook then sends it as ``none`` does (see
        :func:`~autocomp.compressors.cast.effective_compressor`)."""
        return False

    def round_wire_bytes(self, shape: torch.Size, dtype: torch.dtype) -> tuple[int, ...]:
        """Bytes of each round's payload; they add up to ``wire_bytes``."""
        return (self.wire_bytes(shape, dtype),)

    decode_share: ClassVar[float] = 0.4
    """Share of the per-step work spent decoding, after the collective (see ``work_shares``)."""

    def work_shares(self, shape: torch.Size) -> tuple[float, float]:
        """Shares of the per-step work on ``shape`` that run between the rounds (the final
        round's payload, computed from the summed first round) and after the last collective
        (the decode); the rest encodes before the first launch.

        The cost model learns the total; the exposure model places each part where the hook
        runs it (``exposure.Group``): a last bucket's decode and final-round work wait for the
        link, so they cost more when its first round queues behind earlier traffic. The
        shares are CPU medians of the hook's own phases (``hook_layer``), one thread, 1-4 M
        elements, 2026-11-25; they varied by under 0.05 across shapes.
        """
        return (0.0, self.decode_share)

    def compress_round(
        self, x: torch.Tensor, round_index: int, received: torch.Tensor, state: dict[str, Any]
    ) -> torch.Tensor:
        """Payload of round ``round_index`` (>= 1) from the previous round's summed result.

        Only called when ``rounds_for(x.shape) > 1``; ``x`` is the tensor given to
        ``compress`` (unchanged since), and the final round's payload is what ``decompress``,
        ``subtract_estimate_`` and ``commit`` see. The payload is summed in place, as
        ``compress``'s is.
        """
        raise NotImplementedError(f"compressor {self.name!r} has a single round")

    def payload_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """Element type of an all-reduce payload (all-gather payloads are always uint8)."""
        return torch.float32

    # ---- state -----------------------------------------------------------------------------

    def init_state(self, shape: torch.Size, seed: int, rank: int) -> dict[str, Any]:
        """Fresh per-layer state. ``seed`` is identical on all ranks, ``rank`` is not."""
        return {}

    # ---- math ------------------------------------------------------------------------------

    @abstractmethod
    def compress(self, x: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        """Encode ``x`` (float32, contiguous) into a 1-D payload; must not modify ``x``. With
        error feedback the payload must not share memory with ``x``: the hook subtracts the
        estimate from ``x`` in place while the payload is still to be sent. An all-reduce
        sums the payload in place, so every compressor's payload must be a tensor of its
        own, sharing memory with neither ``x`` nor ``state`` (``none`` returns ``x`` itself,
        but the hook sends its layers plain and never calls it)."""

    @abstractmethod
    def decompress(
        self, payload: torch.Tensor, shape: torch.Size, state: dict[str, Any]
    ) -> torch.Tensor:
        """Decode one (or, for all-reduce, a summed) payload into a float32 tensor of ``shape``."""

    def decompress_sum(
        self, payloads: list[torch.Tensor], shape: torch.Size, state: dict[str, Any]
    ) -> torch.Tensor:
        """Sum of the decoded payloads of all ranks, in rank order (deterministic everywhere)."""
        total = self.decompress(payloads[0], shape, state)
        for payload in payloads[1:]:
            total.add_(self.decompress(payload, shape, state))
        return total

    def subtract_estimate_(
        self, x: torch.Tensor, payload: torch.Tensor, state: dict[str, Any]
    ) -> torch.Tensor:
        """``x -= decompress(payload)`` in place (error feedback); subclasses may fuse it."""
        return x.sub_(self.decompress(payload, x.shape, state))

    def decompress_into(
        self,
        received: torch.Tensor | list[torch.Tensor],
        out: torch.Tensor,
        shape: torch.Size,
        state: dict[str, Any],
    ) -> None:
        """Write the decoded average into ``out`` (a flat slice of the bucket buffer).

        ``received`` is the summed payload (all-reduce) or every rank's payload (all-gather).
        Subclasses may decode straight into ``out`` instead of through a temporary.
        """
        if isinstance(received, list):
            estimate = self.decompress_sum(received, shape, state)
        else:
            estimate = self.decompress(received, shape, state)
        out.copy_(estimate.reshape(-1))

    def commit(self, payload: torch.Tensor | list[torch.Tensor], state: dict[str, Any]) -> None:
        """Advance per-layer state once per step after the collective (warm start, counters)."""


def run_rounds_locally(
    compressor: Compressor, x: torch.Tensor, state: dict[str, Any]
) -> torch.Tensor:
    """The final payload one rank alone would send (each round's sum is its own payload).

    For tests and single-process replays of multi-round compressors; with one round it is
    ``compress``.
    """
    payload = compressor.compress(x, state)
    for round_index in range(1, compressor.rounds_for(x.shape)):
        payload = compressor.compress_round(x, round_index, payload, state)
    return payload


_REGISTRY: dict[str, type[Compressor]] = {}


def register_compressor(cls: type[Compressor]) -> type[Compressor]:
    """Class decorator: make ``cls`` buildable from spec strings under ``cls.name``."""
    name = getattr(cls, "name", None)
    if not name or not isinstance(name, str) or ":" in name or "," in name:
        raise ValueError(f"{cls.__name__} needs a class attribute name without ':' or ','")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"a compressor named {name!r} is already registered")
    _REGISTRY[name] = cls
    return cls


def available_compressors() -> dict[str, type[Compressor]]:
    """Registered compressors by name."""
    return dict(_REGISTRY)


def _valid_names() -> str:
    return ", ".join(sorted(_REGISTRY))


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``"topk:ratio=0.01,ef=true"`` into ``("topk", {"ratio": "0.01", "ef": "true"})``."""
    if not isinstance(spec, str):
        raise TypeError(f"a compressor spec is a string like 'topk:ratio=0.01', got {spec!r}")
    name, _, body = spec.strip().partition(":")
    name = name.strip().lower()
    if not name:
        raise ValueError(f"empty compressor spec {spec!r}; valid names: {_valid_names()}")
    params: dict[str, str] = {}
    if body.strip():
        for item in body.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key or not value.strip():
                raise ValueError(
                    f"bad parameter {item.strip()!r} in spec {spec!r}: expected key=value, "
                    "e.g. 'topk:ratio=0.01'"
                )
            if key in params:
                raise ValueError(f"parameter {key!r} given twice in spec {spec!r}")
            params[key] = value.strip()
    return name, params


def build_compressor(spec: str | Compressor) -> Compressor:
    """A compressor from a spec string like ``"powersgd:rank=4"`` (or pass one through)."""
    if isinstance(spec, Compressor):
        return spec
    name, params = parse_spec(spec)
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"unknown compressor {name!r} in spec {spec!r}; valid: {_valid_names()}")
    return cls(**params)
