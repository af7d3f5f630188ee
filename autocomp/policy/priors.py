"""Relative compression errors per layer and option: measured where possible, else priors.

A layer's option has the predicted squared error ``rel_error^2 * weight * family weight``,
the weight being the layer's share of a step's progress as the ``error_weight`` rule
estimates it (:func:`autocomp.policy.rules.error_weight`), the family weight what one unit
of that family's squared error costs in per-step progress
(:attr:`ErrorPriors.progress_weight_by_family`).
``rel_error`` is the profiler's measured value for that spec
(smoothed over windows by the caller) when there is one, else the :class:`ErrorPriors` value,
scaled by how the layer's measured specs of the same family compare with their priors
(geometric mean of the ratios); failing those, by the layer's other measured specs, but only
upwards (a layer hard for one family is likely hard for all; one that suits top-k says nothing
good about PowerSGD). A biased compressor's scaled prior is capped at 1, the error of sending
nothing.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import torch

from autocomp.compressors import (
    QSGD,
    BFloat16,
    Compressor,
    Float16,
    Int8,
    NoCompression,
    PowerSGD,
    RandomK,
    Sign,
    TopK,
    build_compressor,
)
from autocomp.compressors.powersgd import matrix_shape
from autocomp.policy.types import LayerProfile

__all__ = ["ErrorPriors", "built", "canonical", "model_scaled", "rel_error"]


def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise linear in log(x) through ``points`` (sorted by x), clamped at both ends."""
    xs = [math.log(p[0]) for p in points]
    lx = math.log(x)
    if lx <= xs[0]:
        return points[0][1]
    if lx >= xs[-1]:
        return points[-1][1]
    i = bisect.bisect_right(xs, lx)
    t = (lx - xs[i - 1]) / (xs[i] - xs[i - 1])
    return points[i - 1][1] + t * (points[i][1] - points[i - 1][1])


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorPriors:
    """Relative one-step error ||C(g) - g|| / ||g|| by compressor family, before measurement.

    Casts, int8, QSGD and sign: measured with ``autocomp_bench.compressor_cost.relative_error``
    on its synthetic gradient-like tensors (Gaussian low-rank part with a 1/i spectrum plus
    Student-t noise, log-normal row/column scales; 512x128 to 4096x1024 and 256x256x3x3).
    PowerSGD and top-k: errors measured *in use* on the benchmark models, of the averaged
    update the optimizer receives (the window's sketch estimate, :mod:`autocomp.error_sketch`;
    2 ranks). Under error feedback the compressor's input is the gradient plus a residual that
    has collected what earlier steps could not send, which is far less low-rank and less
    sparse than a fresh gradient. A profiler measurement for the spec always overrides the
    prior.
    """

    fp16: float = 2.5e-4
    """Round to half precision."""
    bf16: float = 1.7e-3
    """Round to bfloat16."""
    int8_by_chunk: tuple[tuple[float, float], ...] = ((64, 0.009), (256, 0.013), (4096, 0.029))
    """(chunk, error) points: a larger chunk shares one max-abs scale over more outliers."""
    qsgd_scale: float = 0.4
    """QSGD error ~ min(scale * sqrt(chunk) / levels, sqrt_scale * (sqrt(chunk) / levels)^0.5)."""
    qsgd_sqrt_scale: float = 0.8
    """Second regime of the QSGD formula, for few levels."""
    sign: float = 0.8
    """1-bit sign with the chunk's RMS as its scale (0.77-0.85 on the synthetic tensors at the
    default chunk; Gaussian noise alone gives sqrt(2 - 2 sqrt(2/pi)) = 0.64)."""
    topk_by_ratio: tuple[tuple[float, float], ...] = (
        (1e-4, 0.995),
        (1e-3, 0.98),
        (1e-2, 0.95),
        (3e-2, 0.9),
        (1e-1, 0.75),
        (3e-1, 0.5),
        (1.0, 0.0),
    )
    """(ratio, error) points, interpolated in log(ratio); in use under error feedback. Top-1%
    sits at the top of its measured range (0.90-0.95), above PowerSGD rank 4, so that the
    order the benchmarks showed survives: at about the same measured error it learned less
    per step (GPT LM at 10 Mbit/s: a plan with top-1% on 9 layers reached 3.85 after 14
    steps, PyTorch's rank-4 hook 3.14 after 16). Relative error does not capture that; the
    family weight does (``progress_weight_by_family``)."""
    powersgd_by_rank: tuple[tuple[float, float], ...] = (
        (1, 0.86),
        (2, 0.78),
        (4, 0.63),
        (8, 0.43),
        (16, 0.28),
        (32, 0.18),
        (64, 0.12),
    )
    """(rank, error) points of the averaged update in use, scaled by sqrt(1 - rank /
    min(rows, cols)) (a rank near the matrix's own sends almost all of it). Ranks 1-8: the
    in-repo GPT LM, L1-weighted over its matrices, steps 40-130 on 2 ranks, whose rank-4
    error (0.63) is the median of five models (0.42 held-out 12-layer GPT, 0.57 LSTM LM, 0.69
    CNN, 0.88 MLP LM; docs/benchmarks-history.md, "The averaged update's error", thirty-first
    session). Ranks 16-64 extend the fall of about a third per doubling that ranks 2-8 show on
    both GPTs. Each rank's own residual reads 0.81-0.95 at every rank: it counts the rank's
    deviation from the mean, which no rank of PowerSGD removes."""
    unknown: float = 0.5
    """Any compressor family not listed (user-registered ones)."""
    progress_weight_by_family: tuple[tuple[str, float], ...] = (("topk", 1.8),)
    """(family, weight) pairs: how much per-step progress one unit of this family's squared
    relative error costs, against PowerSGD's and the quantizers' (1; any family not listed).
    Relative error alone does not rank families: on the GPT byte LM (``autocomp-bench
    quality --task gpt --steps 300``, 2026-11-23) top-1% under error feedback delivers 0.28 of
    an uncompressed step's progress against rank 4's 0.70-0.85, and top-3% 0.41. A sparsifier
    starves most coordinates for several steps, while a low-rank approximation moves every
    weight along the gradient's leading directions each step. The weight was 3 with
    ``error_cost`` 0.2 on each rank's own reading; top-k's averaged error is its rank's
    (0.91-0.94 against 0.93-0.95 at 1%, the thirty-first session), so 1.8 with ``error_cost``
    0.33 prices it as before."""

    in_use_families: tuple[str, ...] = ("powersgd", "topk")
    """Families whose prior is an error measured in use, under error feedback and warm starts,
    and whose one-step error on a fresh gradient understates it (see :meth:`in_use`)."""
    family_scale: tuple[tuple[str, float], ...] = ()
    """(family, factor) pairs multiplying an in-use family's prior (capped at 1): how this
    model's measured errors of that family compare with the priors. The level is the model's:
    PowerSGD rank 4 reads 0.42-0.88 on five models against its prior 0.63. The engine sets it
    per decision from every layer's measurements (:func:`model_scaled`), so a layer the plan
    moved off a family before it was measured there is priced at the model's level."""

    def in_use(
        self,
        compressor: Compressor,
        shape: torch.Size,
        one_step: float,
        nonzero_share: float = 1.0,
    ) -> float:
        """The error to plan with, from one measured on a single fresh gradient.

        PowerSGD's and top-k's error in training comes from the residual that error feedback
        carries and, for PowerSGD, from a warm start one power iteration behind a gradient
        that changes every step; a fresh gradient, early in training, is far more low-rank
        than that. On the LSTM LM (``lstm-lm``, 1024x256 recurrent matrix, 2026-11-26) rank 4
        measured 0.04 on step 0's gradient, 0.38 on step 200's, and 0.90 in use (error
        feedback over 40 steps from step 200); rank 1 0.70, 0.82 and 0.98. So for these
        families the in-use prior is a floor under the one-step figure; the quantizers' error
        does not depend on the history (int8 0.005 either way) and is taken as measured.
        """
        if compressor.name not in self.in_use_families:
            return one_step
        return max(one_step, self.rel_error(compressor, shape, nonzero_share))

    def progress_weight(self, compressor: Compressor) -> float:
        """The weight of ``compressor``'s squared error in the progress it costs (see
        ``progress_weight_by_family``)."""
        for family, weight in self.progress_weight_by_family:
            if family == compressor.name:
                return weight
        return 1.0

    def rel_error(
        self, compressor: Compressor, shape: torch.Size, nonzero_share: float = 1.0
    ) -> float:
        """The prior relative error of ``compressor`` on a gradient of ``shape`` of which
        ``nonzero_share`` of the elements are nonzero.

        The share matters to top-k only: the points above were measured on dense gradients,
        and top-k at ratio r of a gradient with nonzero share d is top-(r/d) of its nonzeros,
        lossless once r >= d (an embedding table's row-sparse gradient: the hashed n-gram
        table's is 0.5-0.6% nonzero, and top-1% with error feedback left a residual of
        exactly 0 over 30 steps). Random-k picks coordinates blind, and sparsity does not
        help it."""
        config = compressor.config
        match compressor:
            case NoCompression():
                return 0.0
            case Float16():
                return self.fp16
            case BFloat16():
                return self.bf16
            case Int8():
                return _interpolate(self.int8_by_chunk, float(config["chunk"]))
            case QSGD():
                spread = math.sqrt(min(int(config["chunk"]), max(1, shape.numel())))
                spread /= int(config["levels"])
                return min(self.qsgd_scale * spread, self.qsgd_sqrt_scale * math.sqrt(spread))
            case Sign():
                return self.sign
            case TopK():
                ratio = float(config["ratio"])
                if ratio >= nonzero_share:
                    return 0.0
                return self._scaled("topk", _interpolate(self.topk_by_ratio, ratio / nonzero_share))
            case RandomK():
                ratio = float(config["ratio"])
                # Unbiased: variance (1/ratio - 1); biased: the unsent fraction is the error.
                return math.sqrt(1 / ratio - 1) if config["unbiased"] else math.sqrt(1 - ratio)
            case PowerSGD():
                if not compressor.compresses(shape):
                    return 0.0
                rank = int(config["rank"])
                smallest = min(matrix_shape(shape))
                base = _interpolate(self.powersgd_by_rank, float(rank))
                return self._scaled("powersgd", base * math.sqrt(max(0.0, 1.0 - rank / smallest)))
            case _:
                return self.unknown

    def _scaled(self, family: str, prior: float) -> float:
        for name, factor in self.family_scale:
            if name == family:
                return min(1.0, prior * factor)
        return prior


def model_scaled(priors: ErrorPriors, layers: Sequence[LayerProfile]) -> ErrorPriors:
    """``priors`` with each in-use family scaled to this model's measurements: the geometric
    mean over every (layer, spec) of that family with a measured error of measured / prior.
    A layer's own measurements still decide its options (:func:`rel_error`: the scale cancels
    in their ratio); this sets the level for the layers that have none in the family."""
    logs: dict[str, list[float]] = {family: [] for family in priors.in_use_families}
    for layer in layers:
        for spec, value in layer.rel_error.items():
            try:
                compressor = built(spec)
            except (ValueError, TypeError) as err:
                raise ValueError(f"{layer.name}: bad spec in rel_error: {err}") from None
            if compressor.name not in logs or not value > 0:
                continue
            prior = priors.rel_error(compressor, layer.shape, layer.nonzero_share)
            if prior > 0:
                logs[compressor.name].append(math.log(value / prior))
    scales = [
        (family, math.exp(math.fsum(values) / len(values)))
        for family, values in logs.items()
        if values
    ]
    return replace(priors, family_scale=tuple(scales)) if scales else priors


@lru_cache(maxsize=1024)
def built(spec: str) -> Compressor:
    """Compressors are immutable configurations: one instance per spec serves every call."""
    return build_compressor(spec)


def canonical(spec: str) -> str:
    return built(spec).spec


def rel_error(compressor: Compressor, layer: LayerProfile, priors: ErrorPriors) -> float:
    """The relative error of ``compressor`` on ``layer`` (see the module docstring)."""
    try:
        measured = {canonical(spec): value for spec, value in layer.rel_error.items()}
    except (ValueError, TypeError) as err:
        raise ValueError(f"{layer.name}: bad spec in rel_error: {err}") from None
    if compressor.spec in measured:
        return float(measured[compressor.spec])
    prior = priors.rel_error(compressor, layer.shape, layer.nonzero_share)
    if prior <= 0:
        return prior
    # The priors' order within a family (rank 16 beats rank 4) holds on real gradients,
    # their level does not: under error feedback a layer may be much harder to compress
    # than the synthetic tensors. Without this, an unmeasured option always looks better
    # than the measured one in use, and the plan hops to it, window after window. The
    # same family's measurements say most; failing those, the layer's others do.
    ratios: dict[bool, list[float]] = {True: [], False: []}
    # Against another family the unscaled prior is the reference: a layer hard for PowerSGD
    # says so against the absolute level, not against the model's (which it helped set).
    absolute = replace(priors, family_scale=()) if priors.family_scale else priors
    for spec, value in measured.items():
        other = built(spec)
        same = other.name == compressor.name
        reference = (priors if same else absolute).rel_error(
            other, layer.shape, layer.nonzero_share
        )
        if reference > 0 and value > 0:
            ratios[same].append(value / reference)
    same_family = bool(ratios[True])
    chosen = ratios[True] or ratios[False]
    if not chosen:
        return prior
    scale = math.exp(math.fsum(math.log(r) for r in chosen) / len(chosen))
    if not same_family:
        # Another family's success says little about this one; its failure says the
        # layer is hard. Only the pessimistic direction crosses families.
        scale = max(1.0, scale)
    # Dropping the whole gradient is a relative error of 1: a biased compressor's
    # calibrated prior never claims worse (unbiased ones may start above 1).
    return min(prior * scale, max(1.0, prior))
