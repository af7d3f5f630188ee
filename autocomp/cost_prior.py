"""What the cost model knows before this run measures anything.

:class:`~autocomp.cost_model.CostModel` starts every prediction from an analytic prior of the
hook's local work per compressor (:data:`PRIORS`, measured once on a CPU and scaled to typical
load) and can be warm-started from offline measurements (:class:`CostSample`, e.g. the
compressor benchmark's output via :func:`samples_from_bench`). Both are plain data and
formulas, kept apart from the learned correction that refines them online.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autocomp.compressors import Collective, Compressor, PowerSGD, TopK
from autocomp.compressors.sparse import selects_among_nonzeros

__all__ = [
    "FALLBACK_PRIOR",
    "PRIORS",
    "CostSample",
    "Prior",
    "effective_rank",
    "payload_count",
    "prior_seconds",
    "samples_from_bench",
    "selected_share",
]

# ---- the analytic prior ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prior:
    """Hook cost of one compressor as a function of size: linear in elements, plus a constant.

    seconds = (local_per_element + P * decode_per_element) * numel
              + local_fixed + P * decode_fixed + rank_per_element * numel * rank

    where P is the number of payloads decoded per step: 1 for all-reduce compressors (one
    summed payload), the world size for all-gather compressors (one payload per rank).
    When top-k selects among a share s of nonzero elements (``sparse.largest_indices``),
    local_per_element loses select_per_element * (1 - s) and gains scan_per_element.
    """

    local_per_element_s: float
    """Compress, error-feedback decompress and write-back, seconds per element."""
    local_fixed_s: float
    """Per-call overhead of the same work (kernel launches, Python), seconds."""
    decode_per_element_s: float
    """Decoding one received payload, seconds per element of the layer."""
    decode_fixed_s: float
    """Per-payload decode overhead, seconds."""
    rank_per_element_s: float = 0.0
    """PowerSGD only: extra seconds per element per unit of rank (the matrix products)."""
    select_per_element_s: float = 0.0
    """Top-k only: the part of local_per_element_s that selects over every element."""
    scan_per_element_s: float = 0.0
    """Top-k only: counting and listing the nonzeros, when the selection runs among them."""

    def seconds(
        self, numel: int, payloads: int, rank: int = 0, selected_share: float | None = None
    ) -> float:
        """``selected_share``: the share of elements the selection runs among when it runs
        among the nonzeros; None when it runs over all of them."""
        local = self.local_per_element_s
        if selected_share is not None:
            local += self.scan_per_element_s - self.select_per_element_s * (1.0 - selected_share)
        per_element = local + payloads * self.decode_per_element_s
        return (
            per_element * numel
            + self.local_fixed_s
            + payloads * self.decode_fixed_s
            + self.rank_per_element_s * numel * rank
        )


# Measured on 2026-11-22 on "Intel(R) Xeon(R) Processor @ 2.80GHz" (Ice Lake, 2 vCPUs under
# KVM), torch 2.13.0+cpu, 2 torch threads, float32 near-square gradients of 4Ki..4Mi elements
# (autocomp_bench.compressor_cost.gradient_like), default parameters, PowerSGD at ranks 1, 4, 16.
# Protocol: the hook's per-layer work replayed without the collective; local part (cast copy,
# residual add, compress, error-feedback decompress and subtract, write-back, commit) and the
# decode of one received payload timed separately; all 60 cases interleaved round-robin over
# 2 x (12 + 20) rounds and the minimum kept, because another benchmark was loading the CPUs.
# Fit: non-negative least squares on relative error. Median |fit - measured| / measured is
# 6-17% per compressor, worst case 46% (small sizes, where the fixed part dominates).
PRIORS: dict[str, Prior] = {
    "fp16": Prior(1.476e-09, 2.505e-05, 1.496e-10, 6.192e-06),
    "bf16": Prior(1.449e-09, 2.307e-05, 1.735e-10, 6.366e-06),
    "int8": Prior(4.389e-09, 1.742e-04, 1.214e-09, 5.483e-05),
    "qsgd": Prior(1.311e-08, 2.130e-04, 1.633e-09, 6.829e-05),
    "sign": Prior(6.980e-09, 2.005e-04, 1.974e-09, 7.910e-05),
    "topk": Prior(1.123e-08, 6.550e-05, 2.739e-10, 3.212e-05, 0.0, 8.09e-09, 1.12e-09),
    "randomk": Prior(7.701e-10, 3.098e-05, 2.414e-10, 9.652e-06),
    "powersgd": Prior(1.365e-09, 6.725e-05, 1.635e-10, 1.168e-05, 3.943e-11),
}
"""Analytic hook cost per compressor name (see the comment above for how it was measured).

Top-k's selection terms were measured on 2026-11-28 on a 2-vCPU KVM guest (AVX2), one torch
thread, ratio 0.01, 1Mi/4Mi/8Mi elements
(``docs/benchmarks-sparse-price-2026-11-28/topk_split.py``):
``torch.topk`` took 70-74% of the dense hook's work (0.72 of local_per_element), and
``count_nonzero`` plus ``nonzero`` on a 0.6%-nonzero tensor 6-13% of it (0.10)."""
FALLBACK_PRIOR = Prior(1.3e-08, 2.1e-04, 2.0e-09, 8.0e-05)
"""Prior of compressors not in :data:`PRIORS`: about the slowest measured one (qsgd/sign)."""


def payload_count(compressor: Compressor, world_size: int) -> int:
    return world_size if compressor.collective is Collective.ALL_GATHER else 1


def effective_rank(compressor: Compressor, shape: torch.Size) -> int:
    if isinstance(compressor, PowerSGD) and compressor.compresses(shape):
        return int(compressor.config["rank"])
    return 0


def selected_share(
    compressor: Compressor, numel: int, nonzero_share: float, device_type: str
) -> float | None:
    """The share of elements top-k's selection runs among on a gradient with
    ``nonzero_share`` nonzeros (the test ``largest_indices`` applies); None: all of them."""
    if not isinstance(compressor, TopK) or nonzero_share >= 1.0:
        return None
    share = max(0.0, nonzero_share)
    return share if selects_among_nonzeros(numel, share * numel, device_type) else None


def prior_seconds(
    compressor: Compressor,
    shape: torch.Size,
    world_size: int,
    nonzero_share: float = 1.0,
    device_type: str = "cpu",
) -> float:
    """Analytic hook cost of ``compressor`` on a layer of ``shape`` (0 for ``none``) whose
    gradient has ``nonzero_share`` of its elements nonzero, computed on ``device_type``.

    ``none`` costs nothing by definition: the hook hands its gradient to the all-reduce as is;
    so does a compressor on a tensor it would send whole (PowerSGD on a 1-D tensor).
    Compressors without a measured prior get :data:`FALLBACK_PRIOR` (conservatively slow).
    """
    size = torch.Size(shape)
    if compressor.sends_as_is(size):
        return 0.0  # the hook sends it as 'none' (``effective_compressor``)
    prior = PRIORS.get(compressor.name, FALLBACK_PRIOR)
    numel = size.numel()
    best_case = prior.seconds(
        numel,
        payload_count(compressor, world_size),
        effective_rank(compressor, size),
        selected_share(compressor, numel, nonzero_share, device_type),
    )
    return PRIOR_TYPICAL_FACTOR * best_case


PRIOR_TYPICAL_FACTOR = 2.0
"""The constants are minimum-over-runs timings on an idle machine; typical hook costs measured
by the compressor benchmark were 1.25-2.4x those. Scaling to typical keeps cold-start decisions
from compressing on links where it does not pay; measurements replace the prior quickly."""


# ---- samples -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CostSample:
    """One measured hook cost, as stored, saved and used for warm starts."""

    spec: str
    """Compressor spec, e.g. ``topk:ratio=0.01,ef=true``."""
    shape: tuple[int, ...]
    """Gradient shape of the layer."""
    seconds: float
    """Measured local hook work for this layer in one step."""
    world_size: int = 2
    """Ranks in the job that measured it (all-gather compressors decode one payload per rank)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "shape": list(self.shape),
            "seconds": self.seconds,
            "world_size": self.world_size,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostSample:
        try:
            return cls(
                spec=str(data["spec"]),
                shape=tuple(int(d) for d in data["shape"]),
                seconds=float(data["seconds"]),
                world_size=int(data.get("world_size", 2)),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a cost sample: {data!r} ({err!r})") from None


def samples_from_bench(
    document: Mapping[str, Any] | Sequence[Mapping[str, Any]],
) -> list[CostSample]:
    """Cost samples from ``python -m autocomp_bench.compressors --json`` output, for warm_start.

    Uses each result's ``hook_ms_min`` when present (least disturbed by other load), else
    ``hook_ms``, and the world size the benchmark modelled (``settings.world_size``, else 2).
    Results without a hook time (``none``) are skipped.
    """
    world = 2
    if isinstance(document, Mapping):
        world = int(document.get("settings", {}).get("world_size", world))
        results = document.get("results", [])
    else:
        results = document
    samples = []
    for result in results:
        milliseconds = result.get("hook_ms_min", result.get("hook_ms"))
        if milliseconds is None or not float(milliseconds) > 0:
            continue
        samples.append(
            CostSample(
                spec=str(result["spec"]),
                shape=tuple(int(d) for d in result["shape"]),
                seconds=float(milliseconds) / 1e3,
                world_size=int(result.get("world_size", world)),
            )
        )
    return samples
