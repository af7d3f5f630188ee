"""Policy rule tables: presets shipped as TOML data, user files, and their validation.

A policy says which compressors the per-layer optimizer may choose from and which rules come
before it (warmup, pins, tiny and 1-D tensors, fast links), plus the thresholds of the
convergence guards. It is data, not code, so an operator can copy a preset, edit it and point
the controller at the copy. Schema, version 1 (``policies/default.toml`` carries the same text)::

    version = 1                     # optional; the only schema version so far

    [policy]                        # every key optional: omitted keys take the defaults below
    description = "..."             # one line for logs and reports
    warmup_steps = 100              # int >= 0: first steps run uncompressed, except ...
    warmup_max_error = 0.02         # 0..1: ... options this accurate (fp16, int8); 0: none
    min_numel = 256                 # int >= 0: smaller tensors are never compressed
    useless_min_numel = 4096        # int >= 0: smaller tensors never take a near-useless option
    compress_1d = false             # bool: whether biases and norm scales may be compressed
    fast_link_gbit = 25.0           # float > 0 (or inf): at or above this bandwidth, all 'none'
    min_gain = 0.05                 # 0..1: a compressed window must measure this much faster
    time_slack = 0.03               # 0..1: plans this close to the fastest count as equally fast
    error_cost = 0.33               # >= 0: per-step progress lost per unit of mean error^2
    target_overlap = 0.9            # 0..1: fraction of communication to hide behind backward
    replan_interval = 50            # int >= 1: steps between two decisions
    candidates = ["none", "fp16", "powersgd:rank=4", "topk:ratio=0.01"]  # 'none' always added

    [[pins]]                        # repeatable, first match wins
    match = "*embed*"               # fnmatch glob over the qualified parameter name
    compressor = "fp16"             # spec string

    [guards]                        # convergence guards (see :class:`GuardRules`)
    loss_spike_ratio = 1.5          # float > 1
    loss_window = 50                # int >= 1
    accordion_threshold = 0.5       # float > 0
    accordion_interval_steps = 100  # int >= 1: steps per Accordion interval
    residual_factor = 32.0          # float > 0
    backoff_recovery_steps = 500    # int >= 1
    max_backoff_levels = 3          # int >= 0

Every error is a ValueError naming the file and the key: unknown keys (with a close match
suggested), wrong types (``true`` is not an integer), negative or out-of-range values, and
specs that :func:`~autocomp.compressors.build_compressor` rejects (its message is included).

Presets are looked up in the package data directory ``autocomp/policies`` (where a wheel
carries them) and, when that does not exist (a source checkout), in the repository's
top-level ``policies/`` directory next to the package.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import importlib.resources
import logging
import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from autocomp.compressors import build_compressor

logger = logging.getLogger(__name__)

__all__ = [
    "SCHEMA_VERSION",
    "GuardRules",
    "Pin",
    "PolicyRules",
    "available_policies",
    "load_policy",
    "parse_policy",
    "presets_dir",
]

SCHEMA_VERSION = 1
"""The only policy file schema version so far."""
POLICY_SUFFIX = ".toml"
"""Suffix of policy files; a string ending in it is always treated as a path."""

_TOP_LEVEL_KEYS = ("version", "policy", "pins", "guards")
_PIN_KEYS = ("match", "compressor")


@dataclass(frozen=True, slots=True)
class _Key:
    """Type and range of one scalar key, shared by the file loader and direct construction."""

    kind: type
    """``int``, ``float``, ``bool`` or ``str``."""
    low: float | None = None
    """Smallest valid value (inclusive unless ``low_open``)."""
    high: float | None = None
    """Largest valid value (inclusive)."""
    low_open: bool = False
    """True when ``low`` itself is not valid."""
    allow_inf: bool = False
    """Whether ``inf`` is a valid float (meaning 'never')."""

    def describe(self) -> str:
        kind = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        text = kind[self.kind]
        if self.low is not None:
            text += f" {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            text += f"{' and' if self.low is not None else ''} <= {self.high:g}"
        return text + (" (or inf)" if self.allow_inf else "")

    def check(self, value: object, where: str) -> Any:
        """``value`` converted to the key's type; ValueError with ``where`` if invalid."""
        wrong = ValueError(f"{where} must be {self.describe()}, got {value!r}")
        if self.kind is bool or self.kind is str:
            if not isinstance(value, self.kind):
                raise wrong
            return value
        # bool is a subclass of int: 'true' must not pass for 1.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong
        if self.kind is int:
            if isinstance(value, float):
                raise wrong
            number: int | float = value
        else:
            number = float(value)
            if math.isnan(number) or (math.isinf(number) and not self.allow_inf):
                raise wrong
            if math.isinf(number) and number > 0:
                return number
        too_low = self.low is not None and (
            number <= self.low if self.low_open else number < self.low
        )
        too_high = self.high is not None and number > self.high
        if too_low or too_high:
            raise wrong
        return number


ERROR_WEIGHTS = ("numel", "grad_norm", "grad_l1")
"""Values of the ``error_weight`` policy key."""


def error_weight(
    mode: str,
    numel: int,
    grad_norm: float,
    nonzero_share: float = 1.0,
    grad_l1: float | None = None,
) -> float:
    """What one unit of a layer's squared relative error costs under ``error_weight = mode``
    (:attr:`PolicyRules.error_weight`): the layer's share of a step's progress, unnormalized.

    ``"grad_l1"`` is the gradient's L1 norm: an Adam-type step moves each parameter by about
    the learning rate along its gradient's sign, so a layer's first-order loss decrease is
    about ``lr x ||g||_1``. ``grad_l1`` is that norm as the hook measured it; before any
    measurement (the opening) it is estimated as ``sqrt(nonzero elements) x`` the L2 norm,
    exact only when the nonzero entries are equal in size: on a transformer LM the measured
    norm is 0.5-0.7 of the estimate on the weight matrices and 0.23-0.32 on the tied
    embedding, whose gradient a few rows dominate. A gradient norm of ``sqrt(numel)`` (the
    opening's stand-in before any gradient is seen) weighs every mode like ``"numel"``."""
    if mode == "grad_norm":
        return grad_norm**2
    if mode == "grad_l1":
        if grad_l1 is not None:
            return grad_l1
        return math.sqrt(numel * nonzero_share) * grad_norm
    if mode == "numel":
        return float(numel)
    raise ValueError(f"error_weight must be one of {', '.join(ERROR_WEIGHTS)}, got {mode!r}")


_POLICY_KEYS: dict[str, _Key] = {
    "description": _Key(str),
    "warmup_steps": _Key(int, low=0),
    "warmup_max_error": _Key(float, low=0.0, high=1.0),
    "min_numel": _Key(int, low=0),
    "useless_min_numel": _Key(int, low=0),
    "compress_1d": _Key(bool),
    "fast_link_gbit": _Key(float, low=0.0, low_open=True, allow_inf=True),
    "min_gain": _Key(float, low=0.0, high=1.0),
    "time_slack": _Key(float, low=0.0, high=1.0),
    "error_cost": _Key(float, low=0.0),
    "error_weight": _Key(str),
    "target_overlap": _Key(float, low=0.0, high=1.0),
    "replan_interval": _Key(int, low=1),
}
_LIST_KEYS = ("candidates",)

_GUARD_KEYS: dict[str, _Key] = {
    "loss_spike_ratio": _Key(float, low=1.0, low_open=True),
    "loss_window": _Key(int, low=1),
    "accordion_threshold": _Key(float, low=0.0, low_open=True),
    "accordion_interval_steps": _Key(int, low=1),
    "residual_factor": _Key(float, low=0.0, low_open=True),
    "backoff_recovery_steps": _Key(int, low=1),
    "max_backoff_levels": _Key(int, low=0),
}


def _unknown_key(where: str, table: str, key: str, valid: Sequence[str]) -> ValueError:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(
        f"{where}: unknown key {key!r} in {table}{hint}; valid: {', '.join(sorted(valid))}"
    )


def _canonical_spec(spec: object, where: str) -> str:
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{where} must be a compressor spec string, got {spec!r}")
    try:
        return build_compressor(spec).spec
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}: bad compressor spec {spec!r}: {err}") from None


def _normalize_candidates(raw: object, where: str) -> tuple[str, ...]:
    """Canonical specs, 'none' first, duplicates rejected (two spellings of one compressor)."""
    if isinstance(raw, str) or not isinstance(raw, Sequence):
        raise ValueError(
            f"{where} must be a list of compressor specs like ['none', 'fp16'], got {raw!r}"
        )
    specs: list[str] = []
    for index, item in enumerate(raw):
        spec = _canonical_spec(item, f"{where}[{index}]")
        if spec in specs:
            raise ValueError(f"{where}[{index}]: {item!r} repeats candidate {spec!r}")
        specs.append(spec)
    none = build_compressor("none").spec
    return (none, *(s for s in specs if s != none))


@dataclass(frozen=True, slots=True)
class Pin:
    """A fixed compressor for the parameters whose qualified name matches a glob."""

    match: str
    """fnmatch-style glob over the parameter's qualified name (``*`` crosses dots)."""
    compressor: str
    """Canonical compressor spec."""

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.match)


def _normalize_pins(raw: object, where: str) -> tuple[Pin, ...]:
    if isinstance(raw, str) or not isinstance(raw, Sequence):
        raise ValueError(f"{where} must be an array of {{match, compressor}} tables, got {raw!r}")
    pins: list[Pin] = []
    for index, item in enumerate(raw):
        here = f"{where}[{index}]"
        if isinstance(item, Pin):
            match, spec = item.match, item.compressor
        elif isinstance(item, Mapping):
            for key in item:
                if key not in _PIN_KEYS:
                    raise ValueError(f"{here}: unknown key {key!r}; valid: {', '.join(_PIN_KEYS)}")
            missing = [k for k in _PIN_KEYS if k not in item]
            if missing:
                raise ValueError(f"{here} is missing {', '.join(missing)}")
            match, spec = item["match"], item["compressor"]
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            match, spec = item
        else:
            raise ValueError(f"{here} must be a {{match, compressor}} table, got {item!r}")
        if not isinstance(match, str) or not match:
            raise ValueError(f"{here}: match must be a non-empty glob string, got {match!r}")
        pins.append(Pin(match, _canonical_spec(spec, f"{here} ({match!r}) compressor")))
    return tuple(pins)


def runtime_pins(pins: Sequence[tuple[str, str]]) -> tuple[Pin, ...]:
    """(glob, spec) pairs given in code (``wrap(pins=...)``, operator pins), checked and
    canonicalized as the policy file's ``[[pins]]`` are."""
    return _normalize_pins(pins, "pins")


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardRules:
    """Thresholds of the convergence guards; a trigger backs a layer off one level."""

    loss_spike_ratio: float = 1.5
    """A loss above this multiple of its running mean is a spike."""
    loss_window: int = 50
    """Steps in the loss running mean."""
    accordion_threshold: float = 0.5
    """Accordion: a relative change of the gradient norm between two intervals above this
    marks a critical regime."""
    accordion_interval_steps: int = 100
    """Steps per Accordion interval (the median window norm of each is compared with the
    reference): shorter intervals react faster and to more noise."""
    residual_factor: float = 32.0
    """An error-feedback residual norm above this multiple of the gradient norm is a trigger."""
    backoff_recovery_steps: int = 500
    """Steps without a trigger before one back-off level is lifted."""
    max_backoff_levels: int = 3
    """Back-off never goes beyond this many levels."""

    def __post_init__(self) -> None:
        for name, key in _GUARD_KEYS.items():
            value = key.check(getattr(self, name), f"GuardRules.{name}")
            object.__setattr__(self, name, value)


_DEFAULT_CANDIDATES = (
    "none",
    "fp16:ef=false",
    "int8",
    "powersgd:rank=16",
    "powersgd:rank=4",
    "topk:ratio=0.01",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRules:
    """One validated policy; the defaults equal ``policies/default.toml``."""

    name: str = "default"
    """Preset name or file stem, for logs and decisions."""
    source: str = "<built-in defaults>"
    """Where the rules came from (a path), for error messages and reports."""
    description: str = "balanced: cheap casts first, low-rank and top-k when the link is slow"
    """One line for logs and reports."""
    warmup_steps: int = 100
    """Steps at the start that run uncompressed, but for the options ``warmup_max_error``
    admits."""
    warmup_max_error: float = 0.02
    """During the warm-up a layer may still take an option whose relative error (measured,
    else the prior) is at most this: fp16 (2.5e-4) and int8 (0.013 at its default chunk)
    pass, low-rank and sparse options (0.8-0.99 under error feedback) do not. The warm-up
    guards against stale warm starts and large error-feedback residuals early in training;
    an option that sends the gradient almost whole has neither, and on a link where it pays,
    every uncompressed warm-up step is lost time (0 keeps the warm-up all uncompressed)."""
    min_numel: int = 256
    """Tensors with fewer elements are never compressed (above it the engine weighs each
    tensor's time on the measured link against its error)."""
    useless_min_numel: int = 4096
    """Tensors with fewer elements never take an option that sends almost nothing of their
    gradient (relative error >= the engine's ``useless_error``), whatever it saves."""
    compress_1d: bool = False
    """Whether 1-D tensors (biases, norm scales) may be compressed."""
    fast_link_gbit: float = 25.0
    """At or above this measured bandwidth (Gbit/s) every layer is sent uncompressed."""
    min_gain: float = 0.05
    """A compressed window must measure at least this much faster than an uncompressed one on
    a similar link, else compression is held off for a while (the payoff check: predictions
    near break-even are not to be trusted); a lossless plan needs ``lossless_min_gain``."""
    time_slack: float = 0.03
    """Plans whose predicted step is within this fraction of the fastest plan's count as
    equally fast; the least compression error among them wins (progress per second)."""
    error_cost: float = 0.33
    """Share of a step's training progress that compression costs per unit of the compressed
    layers' mean squared relative error (of the averaged update): a compressed plan must be
    predicted (and measured) to shorten the step by ``error_cost`` x that mean, else those
    layers stay uncompressed. Measured per unit of the averaged update's squared error with
    PowerSGD rank 4 everywhere: 0.50 GPT LM, 0.34 held-out GPT, 0.31 LSTM LM, 0.22 MLP LM
    (geometric mean 0.33); 0.02 on a CNN classifier. On the GPT LM ranks 1-8 read 0.50-0.71
    (docs/policy.md)."""
    error_weight: str = "grad_l1"
    """How layers' compression errors add up (:func:`error_weight`): ``"numel"`` (relative
    error^2 x parameters: every parameter's update counts alike), ``"grad_l1"`` (x the
    gradient's L1 norm: an Adam-type step's first-order progress) or
    ``"grad_norm"`` (x gradient norm^2: the absolute error, right for plain SGD, where small
    gradients make small steps)."""
    target_overlap: float = 0.9
    """Default fraction of communication to hide behind backward compute."""
    replan_interval: int = 50
    """Steps between two decisions."""
    candidates: tuple[str, ...] = _DEFAULT_CANDIDATES
    """Canonical compressor specs the optimizer may choose from; 'none' first."""
    pins: tuple[Pin, ...] = ()
    """Fixed compressors by parameter-name glob, first match wins."""
    guards: GuardRules = field(default_factory=GuardRules)
    """Convergence guard thresholds."""

    def __post_init__(self) -> None:
        for name, key in _POLICY_KEYS.items():
            value = key.check(getattr(self, name), f"PolicyRules.{name}")
            object.__setattr__(self, name, value)
        if self.error_weight not in ERROR_WEIGHTS:
            raise ValueError(
                f"PolicyRules.error_weight must be one of {', '.join(ERROR_WEIGHTS)}, "
                f"got {self.error_weight!r}"
            )
        candidates = _normalize_candidates(self.candidates, "PolicyRules.candidates")
        object.__setattr__(self, "candidates", candidates)
        object.__setattr__(self, "pins", _normalize_pins(self.pins, "PolicyRules.pins"))
        if not isinstance(self.guards, GuardRules):
            raise ValueError(f"PolicyRules.guards must be GuardRules, got {self.guards!r}")

    @property
    def lossless_min_gain(self) -> float:
        """``min_gain`` for a plan whose compression error costs no per-step progress (fp16,
        bf16): ``time_slack``, within which plans count as equally fast, at most
        ``min_gain``. The bar guards such a plan only against noise (docs/policy.md)."""
        return min(self.time_slack, self.min_gain)

    def pin_for(self, name: str) -> Pin | None:
        """The first pin whose glob matches ``name``, if any."""
        return next((pin for pin in self.pins if pin.matches(name)), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (``inf`` becomes the string ``"inf"``)."""
        fast = self.fast_link_gbit
        return {
            "name": self.name,
            "source": self.source,
            "description": self.description,
            "warmup_steps": self.warmup_steps,
            "warmup_max_error": self.warmup_max_error,
            "min_numel": self.min_numel,
            "useless_min_numel": self.useless_min_numel,
            "compress_1d": self.compress_1d,
            "fast_link_gbit": fast if math.isfinite(fast) else "inf",
            "min_gain": self.min_gain,
            "time_slack": self.time_slack,
            "error_cost": self.error_cost,
            "error_weight": self.error_weight,
            "target_overlap": self.target_overlap,
            "replan_interval": self.replan_interval,
            "candidates": list(self.candidates),
            "pins": [{"match": p.match, "compressor": p.compressor} for p in self.pins],
            "guards": dataclasses.asdict(self.guards),
        }


# ---- parsing -------------------------------------------------------------------------------


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: [{key}] must be a table, got {value!r}")
    return value


def _scalars(
    table: Mapping[str, Any], keys: Mapping[str, _Key], extra: Sequence[str], name: str, where: str
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key in keys:
            out[key] = keys[key].check(value, f"{where}: [{name}] {key}")
        elif key not in extra:
            raise _unknown_key(where, f"[{name}]", key, [*keys, *extra])
    return out


def parse_policy(data: Mapping[str, Any], *, name: str, source: str) -> PolicyRules:
    """Validate decoded TOML; every error names ``source`` and the offending key."""
    where = source
    for key in data:
        if key not in _TOP_LEVEL_KEYS:
            raise _unknown_key(where, "the top level", key, _TOP_LEVEL_KEYS)
    version = data.get("version", SCHEMA_VERSION)
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise ValueError(
            f"{where}: version {version!r} is not supported (expected {SCHEMA_VERSION})"
        )
    policy = _table(data, "policy", where)
    values = _scalars(policy, _POLICY_KEYS, _LIST_KEYS, "policy", where)
    if "candidates" in policy:
        values["candidates"] = _normalize_candidates(
            policy["candidates"], f"{where}: [policy] candidates"
        )
    pins = _normalize_pins(data.get("pins", []), f"{where}: pins")
    guards = GuardRules(**_scalars(_table(data, "guards", where), _GUARD_KEYS, (), "guards", where))
    return PolicyRules(name=name, source=source, pins=pins, guards=guards, **values)


def _parse_text(text: str, *, name: str, source: str) -> PolicyRules:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{source}: not valid TOML: {err}") from None
    return parse_policy(data, name=name, source=source)


# ---- presets -------------------------------------------------------------------------------


def _has_policies(directory: Traversable) -> bool:
    try:
        return directory.is_dir() and any(
            entry.name.endswith(POLICY_SUFFIX) for entry in directory.iterdir()
        )
    except OSError:
        return False


def _candidate_dirs() -> list[Traversable]:
    # Wheel layout first (package data), then a source checkout's top-level policies/.
    packaged = importlib.resources.files("autocomp") / "policies"
    checkout = Path(__file__).resolve().parent.parent.parent / "policies"
    return [packaged, checkout]


def presets_dir() -> Traversable | None:
    """The directory holding the shipped presets, or None if none is found."""
    for directory in _candidate_dirs():
        if _has_policies(directory):
            return directory
    return None


def available_policies() -> list[str]:
    """Names of the shipped presets, sorted (``load_policy`` accepts each)."""
    directory = presets_dir()
    if directory is None:
        return []
    return sorted(
        entry.name.removesuffix(POLICY_SUFFIX)
        for entry in directory.iterdir()
        if entry.name.endswith(POLICY_SUFFIX) and entry.is_file()
    )


def _looks_like_path(text: str) -> bool:
    return text.endswith(POLICY_SUFFIX) or "/" in text or os.sep in text


def load_policy(name_or_path: str | Path | PolicyRules) -> PolicyRules:
    """Rules from a preset name (``"wan"``), a TOML file path, or a PolicyRules passed through.

    A ``Path``, or a string that ends in ``.toml`` or contains a path separator, is a file;
    any other string names a shipped preset. Raises ValueError for an unknown preset (listing
    the available ones), a missing file, invalid TOML, or invalid content.
    """
    if isinstance(name_or_path, PolicyRules):
        return name_or_path
    if isinstance(name_or_path, Path) or (
        isinstance(name_or_path, str) and _looks_like_path(name_or_path)
    ):
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(
                f"policy file {str(path)!r} does not exist; pass a preset name "
                f"({', '.join(available_policies()) or 'none found'}) or a TOML file path"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"policy file {str(path)!r} cannot be read: {err}") from None
        return _parse_text(
            text, name=path.name.removesuffix(POLICY_SUFFIX), source=f"policy file {str(path)!r}"
        )
    if not isinstance(name_or_path, str):
        raise TypeError(
            f"a policy is a preset name, a TOML file path or PolicyRules, got {name_or_path!r}"
        )
    name = name_or_path.strip().lower()
    available = available_policies()
    if name not in available:
        looked = ", ".join(str(d) for d in _candidate_dirs())
        raise ValueError(
            f"unknown policy preset {name_or_path!r}; available: "
            f"{', '.join(available) if available else f'none (looked in {looked})'}; "
            "or pass the path of a .toml file"
        )
    directory = presets_dir()
    assert directory is not None
    entry = directory / f"{name}{POLICY_SUFFIX}"
    logger.debug("loading policy preset %r from %s", name, entry)
    return _parse_text(
        entry.read_text(encoding="utf-8"), name=name, source=f"preset {str(entry)!r}"
    )
