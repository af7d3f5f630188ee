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

__all__ = ["RIDING_RULES", "riders"]

RIDING_RULES = frozenset({RULE_ONE_D, RULE_TOO_SMALL})
"""Rules whose 'none' is about a lossy option's error, which a lossless cast does not have."""


def _lossless_cast(spec: str) -> CastCompressor | None:
    compressor = built(spec)
    if isinstance(compressor, CastCompressor) and not compressor.error_feedback:
        return compressor
    return None


def riders(
    layers: Sequence[LayerProfile], decisions: Sequence[LayerDecision | None]
) -> dict[int, str]:
    """Index -> cast spec for each layer that rides along with its bucket's cast.

    In each bucket (layers without a bucket index form one together), the layers held at
    'none' by a rule of ``RIDING_RULES`` take the first lossless cast spec among the bucket's
    other layers, if it has one, and if none of those others sends an all-reduce payload of
    the held layers' own dtype (a matrix left uncompressed, PowerSGD's factors): the held
    layers then save that dtype's collective, and the bucket sends one collective less. Held
    layers no wider than the cast stay as they are."""
    by_bucket: dict[int | None, list[int]] = {}
    for index, layer in enumerate(layers):
        by_bucket.setdefault(layer.bucket, []).append(index)
    chosen: dict[int, str] = {}
    for indices in by_bucket.values():
        held = [
            i
            for i in indices
            if (d := decisions[i]) is not None and d.rule in RIDING_RULES and d.spec == NONE_SPEC
        ]
        if not held:
            continue
        held_dtypes = {layers[i].dtype for i in held}
        cast: CastCompressor | None = None
        blocked = False
        for index in indices:
            decided = decisions[index]
            if index in held:
                continue
            if decided is None:
                blocked = True
                break
            layer = layers[index]
            compressor = effective_compressor(built(decided.spec), layer.shape)
            if (
                compressor.collective is Collective.ALL_REDUCE
                and compressor.payload_dtype(layer.dtype) in held_dtypes
            ):
                blocked = True
                break
            lossless = _lossless_cast(decided.spec)
            if cast is None and lossless is not None:
                cast = lossless
        if blocked or cast is None:
            continue
        wire = cast.wire_dtype.itemsize
        for index in held:
            dtype = layers[index].dtype
            if dtype.is_floating_point and dtype.itemsize > wire:
                chosen[index] = cast.spec
    return chosen
