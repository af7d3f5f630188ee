"""Small tensors held uncompressed by rule ride along with their bucket's lossless cast.

The engine keeps 1-D tensors (biases, norm scales; ``compress_1d``) and tensors under
``min_numel`` elements uncompressed by rule: a lossy option's error is not worth their few
bytes. A lossless cast is another matter. When every other layer of their DDP bucket goes out
on one cast without error feedback (fp16 or bf16), these tensors are the bucket's only float32
parts, and the hook sends each payload dtype as its own all-reduce: two collectives per bucket
where PyTorch's fp16 hook sends one, and the float32 parts cut out and copied back one by one
instead of riding in the bucket-wide cast span (:mod:`autocomp.hook_cast_span`).

Measured on the digits ViT at 500 Mbit/s (2 ranks, the modes interleaved step by step over the
shaped link, 300 steps each, paired medians against plain DDP; fifty-second session,
``docs/benchmarks-matrix-2026-12-01/session-52/inter_rules.py``): fp16 on the tensors the
rules allow and ``none`` on the rest, the plan the engine chose, stepped 0.970x; fp16 on every
tensor 0.942x; PyTorch's fp16 hook 0.935x; autocomp uncompressed 0.994x. The float32 leftovers
took more than half of what fp16 saved, and the payoff check, which asks a plan to measure 3%
faster than uncompressed, held the plan that saved 2.4%.

Cast, a rider's gradient loses what its neighbours' lose (fp16: a relative error near 2.5e-4,
saturated rather than overflowed), so the rule-held layers of a bucket that has a layer on a
lossless cast take that cast, unless another layer of the bucket sends a float32 all-reduce
anyway (a matrix the search left uncompressed, a pin to ``none``, PowerSGD's factors, which
the float32 parts join): then riding would add the cast's collective instead of saving one.
Layers on an all-gather (int8, top-k) do not count; their collective is there either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from autocomp.compressors import Collective, effective_compressor
from autocomp.compressors.cast import CastCompressor
from autocomp.policy.priors import built
from autocomp.policy.types import (
    NONE_SPEC,
    RULE_ONE_D,
    RULE_TOO_SMALL,
    LayerDecision,
    LayerProfile,
)

__all__ = ["RIDING_RULES", "cast_only_buckets", "completions", "lossless_cast", "riders"]

RIDING_RULES = frozenset({RULE_ONE_D, RULE_TOO_SMALL})
"""Rules whose 'none' is about a lossy option's error, which a lossless cast does not have."""


def lossless_cast(spec: str) -> CastCompressor | None:
    """The cast ``spec`` builds when it is fp16/bf16 without error feedback, else None."""
    compressor = built(spec)
    if isinstance(compressor, CastCompressor) and not compressor.error_feedback:
        return compressor
    return None


@dataclass(slots=True)
class _Bucket:
    """One bucket's layers as the ride-along sees them."""

    cast: CastCompressor | None = None
    """The first lossless cast among the layers that are not held."""
    held: list[int] = field(default_factory=list)
    """Layers a rule of ``RIDING_RULES`` holds at 'none'."""
    open: list[int] = field(default_factory=list)
    """Searched layers (``searched``) the search left at 'none': they could take the cast."""
    blocked: bool = False
    """Some other layer sends an all-reduce of the held layers' dtype (or is undecided)."""


def _scan(
    layers: Sequence[LayerProfile],
    decisions: Sequence[LayerDecision | None],
    searched: frozenset[int] = frozenset(),
) -> dict[int | None, _Bucket]:
    indices_by_bucket: dict[int | None, list[int]] = {}
    for index, layer in enumerate(layers):
        indices_by_bucket.setdefault(layer.bucket, []).append(index)
    out: dict[int | None, _Bucket] = {}
    for bucket, indices in indices_by_bucket.items():
        scan = out[bucket] = _Bucket()
        for index in indices:
            decided, layer = decisions[index], layers[index]
            if decided is None:
                scan.blocked = True
                continue
            if decided.spec == NONE_SPEC and decided.rule in RIDING_RULES:
                scan.held.append(index)
                continue
            if decided.spec == NONE_SPEC and index in searched:
                scan.open.append(index)
                continue
            lossless = lossless_cast(decided.spec)
            if lossless is not None:
                scan.cast = scan.cast or lossless
                continue
            compressor = effective_compressor(built(decided.spec), layer.shape)
            if (
                compressor.collective is Collective.ALL_REDUCE
                and compressor.payload_dtype(layer.dtype) == layer.dtype
            ):
                scan.blocked = True
    return out


def _wider(layer: LayerProfile, cast: CastCompressor) -> bool:
    return layer.dtype.is_floating_point and layer.dtype.itemsize > cast.wire_dtype.itemsize


def riders(
    layers: Sequence[LayerProfile], decisions: Sequence[LayerDecision | None]
) -> dict[int, str]:
    """Index -> cast spec for each layer that rides along with its bucket's cast.

    In each bucket (layers without a bucket index form one together), the layers held at
    'none' by a rule of ``RIDING_RULES`` take the first lossless cast spec among the bucket's
    other layers, if it has one, and if none of those others sends an all-reduce payload of
    its own dtype (a matrix left uncompressed, PowerSGD's factors): the held layers then
    save that collective, and the bucket sends one collective less. Held layers no wider
    than the cast stay as they are."""
    chosen: dict[int, str] = {}
    for scan in _scan(layers, decisions).values():
        if scan.blocked or scan.cast is None:
            continue
        for index in scan.held:
            if _wider(layers[index], scan.cast):
                chosen[index] = scan.cast.spec
    return chosen


def completions(
    layers: Sequence[LayerProfile],
    decisions: Sequence[LayerDecision | None],
    searched: Sequence[int],
) -> dict[int, str]:
    """Index -> cast spec for the searched layers left at 'none' in a bucket that would
    otherwise send nothing else uncompressed: on its cast, with its riders, the bucket drops
    its float32 all-reduce. A proposal; the engine keeps it only if its exposure model
    predicts the step no longer (the cast's work against the collective and the bytes)."""
    chosen: dict[int, str] = {}
    for scan in _scan(layers, decisions, frozenset(searched)).values():
        if scan.blocked or scan.cast is None or not scan.open:
            continue
        if all(_wider(layers[index], scan.cast) for index in scan.open):
            chosen.update(dict.fromkeys(scan.open, scan.cast.spec))
    return chosen


def cast_only_buckets(
    layers: Sequence[LayerProfile], decisions: Sequence[LayerDecision | None]
) -> set[int | None]:
    """Buckets with no all-reduce of their own dtype once their riders ride: a lossless cast,
    nothing blocking, nothing left open. Each is one all-reduce fewer than the engine's
    per-bucket latency counts (that collective is the cast's own)."""
    return {
        bucket
        for bucket, scan in _scan(layers, decisions).items()
        if scan.cast is not None and not scan.blocked
    }
