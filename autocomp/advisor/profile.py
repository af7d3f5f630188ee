"""The profile file: what ``autocomp-advisor profile`` measured, as versioned JSON.

A profile is the only input of ``recommend``, which may run days later on another machine, so
it is self-describing: every time is in seconds, every size in bytes, and the first key is
``"autocomp_profile_version"``. Files of another version, truncated files and files that are
not profiles are refused with :class:`ProfileError` naming the file and the problem, because a
what-if model built on a half-read profile would give confident wrong answers.

Schema, version 1 (``?`` marks a value that may be null)::

    {
      "autocomp_profile_version": 1,
      "created": "2026-11-22T03:00:00+00:00",
      "complete": true,                 # false: the script failed or ended early (partial)
      "status": "stopped after 5 steps",
      "notes": ["..."],                 # anything the reader should know (warm-up only, ...)
      "script": {"path": "...", "args": [...], "steps_requested": 5, "steps_captured": 5},
      "environment": {"torch": "...", "python": "...", "cpu": "...", "threads": 1,
                      "backend": "gloo", "device": "cpu", "launcher": "spawn"},
      "world_size": 2,                  # ranks of the profiling run
      "models": [{                      # one per DistributedDataParallel the script built
        "index": 0, "module_class": "DigitsCNN",
        "layers": [{"name": "fc.weight", "shape": [256, 1024], "dtype": "float32",
                    "bucket": 0?, "grad_norm": 0.12, "grad_l1": 40.1?}],
        "buckets": [{"index": 0, "params": ["fc.weight", ...], "bytes": 1049600,
                     "ready_s": 0.0021}],           # in the order they became ready
        "timing": {"steps_used": 4, "forward_s": ..., "backward_s": ...,
                   "first_bucket_ready_s": ..., "last_bucket_ready_s": ...,
                   "hideable_s": ..., "step_s": ..., "exposed_comm_s": ..., "hook_s": ...,
                   "compute_step_s": ..., "rank_step_s": [...]}
      }],
      "link": {"latency_s": 4e-5, "bandwidth_bytes_per_s": 1.2e9, "rel_residual": 0.05,
               "method": "bandwidth-meter", "world_size": 2,
               "samples": [[payload_bytes, seconds], ...],
               "contention_seconds_per_byte": 2e-9,         # optional (older files: 0)
               "half_sum_seconds_per_element": {"float16": 1e-9, "bfloat16": 0.0}  # optional
              }?,                                           # null: one rank, or failed run
      "compressors": {"budget_s": 20.0, "threads": 1, "world_size": 2,
                      "results": [{"spec": "powersgd:rank=4,ef=true", "shape": [256, 1024],
                                   "collective": "all_reduce", "wire_bytes": 10240,
                                   "local_s": 1.1e-4, "decode_s": 2e-5, "reps": 5,
                                   "rel_error": 0.61}],
                      "skipped": ["..."]}
    }

Timeline fields (``docs/policy.md`` defines backward, hideable and exposed time):
``ready_s`` and ``*_bucket_ready_s`` count from the end of the forward, with the comm hook's
own time removed, so they describe compute alone; ``compute_step_s`` is the measured step
minus the exposed communication and the hook time (per step, then the median; at least
forward + backward): the step a single rank would take. ``grad_norm`` is the norm of the averaged
gradient in the first captured step where it is not zero, ``grad_l1`` its L1 norm (absent in
profiles from before it was recorded).
``local_s`` is the hook work on the sending side of one layer (copy, residual, compress,
error-feedback decode, write-back, commit), ``decode_s`` the decode of *one* received payload:
an all-gather compressor decodes one per rank, an all-reduce one decodes one summed payload.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from autocomp.cost_model import HALF_DTYPES_BY_NAME

__all__ = [
    "PROFILE_VERSION",
    "VERSION_KEY",
    "BucketInfo",
    "CompressorMeasurement",
    "LayerInfo",
    "LinkMeasurement",
    "ModelProfile",
    "Profile",
    "ProfileError",
    "ScriptInfo",
    "Timing",
]

PROFILE_VERSION = 1
"""The only profile version so far; other versions are refused."""
VERSION_KEY = "autocomp_profile_version"
"""First key of every profile file."""


class ProfileError(ValueError):
    """A profile file cannot be used; the message names the file and what is wrong."""


# ---- field readers ---------------------------------------------------------------------------


def _get(data: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where} must be an object, got {type(data).__name__}")
    if key not in data:
        raise ProfileError(f"{where} is missing {key!r}")
    return data[key]


def _number(data: Mapping[str, Any], key: str, where: str, *, low: float = 0.0) -> float:
    value = _get(data, key, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"{where}.{key} must be a number, got {value!r}")
    if not math.isfinite(value) or value < low:
        raise ProfileError(f"{where}.{key} must be finite and >= {low:g}, got {value!r}")
    return float(value)


def _integer(data: Mapping[str, Any], key: str, where: str, *, low: int = 0) -> int:
    value = _get(data, key, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ProfileError(f"{where}.{key} must be an integer >= {low}, got {value!r}")
    return value


def _text(data: Mapping[str, Any], key: str, where: str) -> str:
    value = _get(data, key, where)
    if not isinstance(value, str):
        raise ProfileError(f"{where}.{key} must be a string, got {value!r}")
    return value


def _list(data: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = _get(data, key, where)
    if not isinstance(value, list):
        raise ProfileError(f"{where}.{key} must be a list, got {type(value).__name__}")
    return value


def _shape(data: Mapping[str, Any], where: str) -> tuple[int, ...]:
    raw = _list(data, "shape", where)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw):
        raise ProfileError(f"{where}.shape must be a list of sizes >= 0, got {raw!r}")
    return tuple(raw)


def dtype_itemsize(name: str) -> int:
    """Bytes per element of a dtype name such as ``float32`` (ProfileError if unknown)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ProfileError(f"unknown dtype {name!r}")
    return dtype.itemsize


# ---- records ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerInfo:
    """One parameter's gradient as DDP communicates it."""

    name: str
    """Qualified name in the wrapped module (what plans and ``autocomp.wrap`` match)."""
    shape: tuple[int, ...]
    """Gradient shape."""
    dtype: str = "float32"
    """Gradient dtype name, as it sits in the DDP bucket."""
    bucket: int | None = None
    """DDP bucket index after DDP's first-iteration rebuild (None if never seen)."""
    grad_norm: float = 0.0
    """L2 norm of the averaged gradient, first non-zero step (weighs compression error)."""
    grad_l1: float | None = None
    """L1 norm of the same gradient (``error_weight = "grad_l1"``; None: not recorded)."""
    nonzero_share: float = 1.0
    """Fraction of the averaged gradient's elements that are nonzero, same step (an
    embedding table's is small, which top-k's error depends on)."""
    sparse_bytes: int | None = None
    """For a sparse gradient (an embedding with ``sparse=True``): the median bytes of values
    and indices one rank contributed per step, which a sparse all-reduce gathers from every
    rank; None for a dense gradient. Sparse gradients are never compressed."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def sparse(self) -> bool:
        return self.sparse_bytes is not None

    @property
    def sent_bytes(self) -> int:
        """Bytes this rank puts into the layer's collective per step, uncompressed."""
        return self.bytes if self.sparse_bytes is None else self.sparse_bytes

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def bytes(self) -> int:
        """Bytes an uncompressed all-reduce carries for this layer per rank."""
        return self.numel * dtype_itemsize(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "bucket": self.bucket,
            "grad_norm": self.grad_norm,
            **({} if self.grad_l1 is None else {"grad_l1": self.grad_l1}),
            **({} if self.nonzero_share == 1.0 else {"nonzero_share": self.nonzero_share}),
            **({} if self.sparse_bytes is None else {"sparse_bytes": self.sparse_bytes}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> LayerInfo:
        bucket = _get(data, "bucket", where)
        if bucket is not None and (isinstance(bucket, bool) or not isinstance(bucket, int)):
            raise ProfileError(f"{where}.bucket must be an integer or null, got {bucket!r}")
        dtype = _text(data, "dtype", where)
        dtype_itemsize(dtype)
        sparse_bytes = data.get("sparse_bytes")  # absent in profiles of dense models
        if sparse_bytes is not None and (
            isinstance(sparse_bytes, bool) or not isinstance(sparse_bytes, int) or sparse_bytes < 0
        ):
            raise ProfileError(
                f"{where}.sparse_bytes must be a non-negative integer or absent, "
                f"got {sparse_bytes!r}"
            )
        share = data.get("nonzero_share", 1.0)  # absent: dense, or a profile from before it
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise ProfileError(f"{where}.nonzero_share must be a number in [0, 1], got {share!r}")
        return cls(
            name=_text(data, "name", where),
            shape=_shape(data, where),
            dtype=dtype,
            bucket=bucket,
            grad_norm=_number(data, "grad_norm", where),
            grad_l1=None if data.get("grad_l1") is None else _number(data, "grad_l1", where),
            nonzero_share=float(share),
            sparse_bytes=sparse_bytes,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BucketInfo:
    """One DDP gradient bucket and when it becomes ready during backward."""

    index: int
    """DDP's bucket index."""
    params: tuple[str, ...]
    """Names of the parameters in the bucket, in bucket order."""
    bytes: int
    """Size of the bucket's flat gradient buffer."""
    ready_s: float
    """Median time from the end of the forward to the bucket being ready (compute only)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "params": list(self.params),
            "bytes": self.bytes,
            "ready_s": self.ready_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> BucketInfo:
        params = _list(data, "params", where)
        if not all(isinstance(p, str) for p in params):
            raise ProfileError(f"{where}.params must be a list of parameter names")
        return cls(
            index=_integer(data, "index", where),
            params=tuple(params),
            bytes=_integer(data, "bytes", where),
            ready_s=_number(data, "ready_s", where),
        )


_TIMING_FIELDS = (
    "forward_s",
    "backward_s",
    "first_bucket_ready_s",
    "last_bucket_ready_s",
    "hideable_s",
    "step_s",
    "exposed_comm_s",
    "hook_s",
    "compute_step_s",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """Medians over the profiled steps (the first step is dropped when there are more)."""

    steps_used: int
    """Steps the medians are taken over."""
    forward_s: float
    """Forward pass(es) of the wrapped module."""
    backward_s: float
    """End of forward to the last bucket ready, hook time removed (B in docs/policy.md)."""
    first_bucket_ready_s: float
    """End of forward to the first bucket ready (compute only)."""
    last_bucket_ready_s: float
    """End of forward to the last bucket ready (compute only; equals backward_s)."""
    hideable_s: float
    """Backward compute after the first bucket is ready (H in docs/policy.md)."""
    step_s: float
    """Whole iteration as measured on the profiling link."""
    exposed_comm_s: float
    """Communication still running after the last hook returned, plus any time a hook call
    waited for an earlier collective (E in docs/policy.md)."""
    hook_s: float
    """Comm hook work per step (launching collectives, any compression and decode), as
    :class:`autocomp.profiler.StepProfiler` counts it; waits on the link are in E."""
    compute_step_s: float
    """Median of step - exposed - hook per step (>= forward + backward): one rank's step."""
    rank_step_s: tuple[float, ...] = ()
    """Median step time of every rank (their spread shows skew between ranks)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"steps_used": self.steps_used}
        out.update({name: getattr(self, name) for name in _TIMING_FIELDS})
        out["rank_step_s"] = list(self.rank_step_s)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> Timing:
        values = {name: _number(data, name, where) for name in _TIMING_FIELDS}
        ranks = data.get("rank_step_s", [])
        if not isinstance(ranks, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in ranks
        ):
            raise ProfileError(f"{where}.rank_step_s must be a list of numbers")
        return cls(
            steps_used=_integer(data, "steps_used", where),
            rank_step_s=tuple(float(v) for v in ranks),
            **values,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelProfile:
    """Everything measured about one DistributedDataParallel model."""

    index: int
    """Order in which the script built it (0 = first)."""
    module_class: str
    """Class name of the wrapped module."""
    layers: tuple[LayerInfo, ...]
    """Parameters that require gradients, in ``named_parameters`` order."""
    buckets: tuple[BucketInfo, ...]
    """Buckets in the order they became ready."""
    timing: Timing
    """Step timeline medians."""

    @property
    def total_bytes(self) -> int:
        return sum(layer.sent_bytes for layer in self.layers)

    def layer(self, name: str) -> LayerInfo:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "module_class": self.module_class,
            "layers": [layer.to_dict() for layer in self.layers],
            "buckets": [bucket.to_dict() for bucket in self.buckets],
            "timing": self.timing.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> ModelProfile:
        layers = tuple(
            LayerInfo.from_dict(item, f"{where}.layers[{i}]")
            for i, item in enumerate(_list(data, "layers", where))
        )
        if not layers:
            raise ProfileError(f"{where}.layers is empty")
        names = {layer.name for layer in layers}
        if len(names) != len(layers):
            raise ProfileError(f"{where}.layers has duplicate names")
        buckets = tuple(
            BucketInfo.from_dict(item, f"{where}.buckets[{i}]")
            for i, item in enumerate(_list(data, "buckets", where))
        )
        if not buckets:
            raise ProfileError(f"{where}.buckets is empty (no backward was captured)")
        for i, bucket in enumerate(buckets):
            unknown = [p for p in bucket.params if p not in names]
            if unknown:
                raise ProfileError(f"{where}.buckets[{i}] names unknown parameters {unknown}")
        return cls(
            index=_integer(data, "index", where),
            module_class=_text(data, "module_class", where),
            layers=layers,
            buckets=buckets,
            timing=Timing.from_dict(_get(data, "timing", where), f"{where}.timing"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkMeasurement:
    """Latency and bandwidth between the profiling ranks, fitted from timed all-reduces."""

    latency_s: float
    """Alpha: seconds per ring hop."""
    bandwidth_bytes_per_s: float
    """1 / beta: bytes per second one rank pushes through its link."""
    rel_residual: float
    """Median relative misfit of the samples."""
    method: str
    """How it was fitted."""
    world_size: int
    """Ranks in the measurement."""
    samples: tuple[tuple[int, float], ...] = ()
    """(payload bytes per rank, seconds) of every timed all-reduce."""
    contention_seconds_per_byte: float = 0.0
    """Compute seconds a transfer took from the profiling machine per byte a rank sent
    (``probe_runner.ProbeRunner.contention``; 0: none measured, or none to measure)."""
    half_sum_seconds_per_element: tuple[tuple[str, float], ...] = ()
    """(dtype name, seconds): what an all-reduce of that half type cost per element beyond
    its bytes (``probe_runner.ProbeRunner.half_sums``; absent: not measured)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "latency_s": self.latency_s,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "rel_residual": self.rel_residual,
            "method": self.method,
            "world_size": self.world_size,
            "samples": [list(s) for s in self.samples],
            "contention_seconds_per_byte": self.contention_seconds_per_byte,
            "half_sum_seconds_per_element": dict(self.half_sum_seconds_per_element),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> LinkMeasurement:
        samples = []
        for i, item in enumerate(_list(data, "samples", where)):
            if not (isinstance(item, list) and len(item) == 2):
                raise ProfileError(f"{where}.samples[{i}] must be [payload_bytes, seconds]")
            samples.append((int(item[0]), float(item[1])))
        bandwidth = _number(data, "bandwidth_bytes_per_s", where)
        if bandwidth <= 0:
            raise ProfileError(f"{where}.bandwidth_bytes_per_s must be > 0")
        # The two machine costs came later in version 1: absent, they read as unmeasured.
        contention = 0.0
        if data.get("contention_seconds_per_byte") is not None:
            contention = _number(data, "contention_seconds_per_byte", where)
        halves = data.get("half_sum_seconds_per_element") or {}
        if not isinstance(halves, Mapping):
            raise ProfileError(f"{where}.half_sum_seconds_per_element must be an object")
        half_sums = []
        for name, value in sorted(halves.items()):
            if name not in HALF_DTYPES_BY_NAME:
                raise ProfileError(
                    f"{where}.half_sum_seconds_per_element: {name!r} is not one of "
                    f"{', '.join(HALF_DTYPES_BY_NAME)}"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ProfileError(f"{where}.half_sum_seconds_per_element.{name} must be a number")
            if not math.isfinite(value) or value < 0:
                raise ProfileError(
                    f"{where}.half_sum_seconds_per_element.{name} must be finite and >= 0"
                )
            half_sums.append((str(name), float(value)))
        return cls(
            latency_s=_number(data, "latency_s", where),
            bandwidth_bytes_per_s=bandwidth,
            rel_residual=_number(data, "rel_residual", where),
            method=_text(data, "method", where),
            world_size=_integer(data, "world_size", where, low=2),
            samples=tuple(samples),
            contention_seconds_per_byte=contention,
            half_sum_seconds_per_element=tuple(half_sums),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CompressorMeasurement:
    """Hook cost of one compressor on one layer shape, measured on the profiling machine."""

    spec: str
    """Canonical compressor spec."""
    shape: tuple[int, ...]
    """Layer shape it was measured on (a real gradient of that shape)."""
    collective: str
    """Collective its payload needs (``all_reduce`` or ``all_gather``)."""
    wire_bytes: int
    """Bytes one rank hands to the collective."""
    local_s: float
    """Sending-side hook work per step (median)."""
    decode_s: float
    """Decoding one received payload, including the write-back (median)."""
    reps: int
    """Timed repetitions behind the medians."""
    rel_error: float | None = None
    """||decompress(compress(g)) - g|| / ||g|| on the real gradient (PowerSGD: after the reps)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "shape": list(self.shape),
            "collective": self.collective,
            "wire_bytes": self.wire_bytes,
            "local_s": self.local_s,
            "decode_s": self.decode_s,
            "reps": self.reps,
            "rel_error": self.rel_error,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> CompressorMeasurement:
        rel = data.get("rel_error")
        if rel is not None and (
            isinstance(rel, bool) or not isinstance(rel, (int, float)) or not rel >= 0
        ):
            raise ProfileError(f"{where}.rel_error must be a number >= 0 or null")
        return cls(
            spec=_text(data, "spec", where),
            shape=_shape(data, where),
            collective=_text(data, "collective", where),
            wire_bytes=_integer(data, "wire_bytes", where),
            local_s=_number(data, "local_s", where),
            decode_s=_number(data, "decode_s", where),
            reps=_integer(data, "reps", where, low=1),
            rel_error=None if rel is None else float(rel),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptInfo:
    """Which script was profiled and how far it got."""

    path: str
    args: tuple[str, ...] = ()
    steps_requested: int = 0
    steps_captured: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "args": list(self.args),
            "steps_requested": self.steps_requested,
            "steps_captured": self.steps_captured,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> ScriptInfo:
        args = _list(data, "args", where)
        return cls(
            path=_text(data, "path", where),
            args=tuple(str(a) for a in args),
            steps_requested=_integer(data, "steps_requested", where),
            steps_captured=_integer(data, "steps_captured", where),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """A whole profile file (see the module docstring for the JSON schema)."""

    created: str
    complete: bool
    status: str
    script: ScriptInfo
    world_size: int
    models: tuple[ModelProfile, ...]
    link: LinkMeasurement | None = None
    compressors: tuple[CompressorMeasurement, ...] = ()
    compressor_budget_s: float = 0.0
    compressor_threads: int = 1
    skipped: tuple[str, ...] = ()
    environment: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    # ---- lookups ---------------------------------------------------------------------------

    def model(self, index: int | None = None) -> ModelProfile:
        """Model ``index``, or by default the one with the most gradient bytes."""
        if index is None:
            return max(self.models, key=lambda m: (m.total_bytes, -m.index))
        for model in self.models:
            if model.index == index:
                return model
        raise ProfileError(
            f"no model {index} in the profile (models: {[m.index for m in self.models]})"
        )

    def measurement(self, spec: str, shape: Sequence[int]) -> CompressorMeasurement | None:
        key = tuple(shape)
        for item in self.compressors:
            if item.spec == spec and item.shape == key:
                return item
        return None

    # ---- JSON ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            VERSION_KEY: PROFILE_VERSION,
            "created": self.created,
            "complete": self.complete,
            "status": self.status,
            "notes": list(self.notes),
            "script": self.script.to_dict(),
            "environment": dict(self.environment),
            "world_size": self.world_size,
            "models": [model.to_dict() for model in self.models],
            "link": None if self.link is None else self.link.to_dict(),
            "compressors": {
                "budget_s": self.compressor_budget_s,
                "threads": self.compressor_threads,
                "world_size": self.world_size,
                "results": [item.to_dict() for item in self.compressors],
                "skipped": list(self.skipped),
            },
        }

    @classmethod
    def from_dict(cls, data: Any) -> Profile:
        """Validate decoded JSON; ProfileError says which field is wrong (not which file)."""
        if not isinstance(data, Mapping):
            raise ProfileError(f"not a profile: the top level is a {type(data).__name__}")
        if VERSION_KEY not in data:
            raise ProfileError(f"not an autocomp profile: no {VERSION_KEY!r} key")
        version = data[VERSION_KEY]
        if version != PROFILE_VERSION or isinstance(version, bool):
            raise ProfileError(
                f"profile version {version!r} is not supported by this advisor "
                f"(it reads version {PROFILE_VERSION}); re-run 'autocomp-advisor profile'"
            )
        where = "profile"
        models = tuple(
            ModelProfile.from_dict(item, f"models[{i}]")
            for i, item in enumerate(_list(data, "models", where))
        )
        if not models:
            raise ProfileError("the profile holds no model (models is empty)")
        link_data = _get(data, "link", where)
        link = None if link_data is None else LinkMeasurement.from_dict(link_data, "link")
        comp = _get(data, "compressors", where)
        results = tuple(
            CompressorMeasurement.from_dict(item, f"compressors.results[{i}]")
            for i, item in enumerate(_list(comp, "results", "compressors"))
        )
        environment = data.get("environment", {})
        if not isinstance(environment, Mapping):
            raise ProfileError("environment must be an object")
        complete = _get(data, "complete", where)
        if not isinstance(complete, bool):
            raise ProfileError(f"complete must be true or false, got {complete!r}")
        return cls(
            created=_text(data, "created", where),
            complete=complete,
            status=_text(data, "status", where),
            notes=tuple(str(n) for n in data.get("notes", [])),
            script=ScriptInfo.from_dict(_get(data, "script", where), "script"),
            environment=dict(environment),
            world_size=_integer(data, "world_size", where, low=1),
            models=models,
            link=link,
            compressors=results,
            compressor_budget_s=_number(comp, "budget_s", "compressors"),
            compressor_threads=_integer(comp, "threads", "compressors", low=1),
            skipped=tuple(str(s) for s in comp.get("skipped", [])),
        )

    def save(self, path: str | Path) -> None:
        """Write atomically (a temporary file renamed over the target)."""
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(target)

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """Read and validate ``path``; ProfileError names the file and what is wrong."""
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ProfileError(f"{file}: no such file") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ProfileError(f"{file}: cannot be read ({err})") from None
        if not text.strip():
            raise ProfileError(f"{file}: empty file, not a profile")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ProfileError(
                f"{file}: not valid JSON, truncated or corrupt ({err.msg} at line {err.lineno} "
                f"column {err.colno})"
            ) from None
        try:
            return cls.from_dict(data)
        except ProfileError as err:
            raise ProfileError(f"{file}: {err}") from None
