"""Compression overhead on this machine, measured on the script's own gradients.

The what-if model needs, per layer shape and compressor, the time the comm hook would add.
The analytic priors in :mod:`autocomp.cost_prior` were measured on one particular CPU; the
machine the job will run on may be faster, slower or a GPU, and real gradients are not the
synthetic ones of the benchmark. So the profiler replays the hook's per-layer work (as
:mod:`autocomp.hook` does it, without the collective) on a real gradient of every distinct
shape, for every candidate, on rank 0 and within a time budget: the largest shapes first,
because they dominate both bytes and cost; what the budget does not cover is left to the cost
model (prior times the correction learned from what was measured).

Two numbers per case, because they scale differently with the number of ranks:

* ``local_s``: what the hook does before the collective
  (``autocomp.hook_layer.encode_locally``: copy to float32 or add into the residual, compress,
  subtract the error-feedback estimate) -- paid once per step whatever the world size;
* ``decode_s``: decoding one received payload into the bucket, its finiteness check and the
  compressor's ``commit`` (``autocomp.hook_layer.decode_into``) -- an all-reduce compressor
  decodes one summed payload, an all-gather compressor one payload per rank.

Both come from :class:`autocomp.hook_layer.LayerReplay`, the hook's own code path, so fused hot
paths (PowerSGD's error feedback inside its matrix product, decoding straight into the
bucket) are costed as they run.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from autocomp.advisor.profile import CompressorMeasurement
from autocomp.compressors import (
    Compressor,
    build_compressor,
    run_rounds_locally,
)
from autocomp.hook_layer import LayerReplay

logger = logging.getLogger(__name__)

__all__ = ["MEASURED_SPECS", "CostMeter", "eligible"]

MEASURED_SPECS: tuple[str, ...] = (
    "fp16:ef=false",
    "int8",
    "powersgd:rank=1",
    "powersgd:rank=2",
    "powersgd:rank=4",
    "powersgd:rank=16",
    "topk:ratio=0.01",
    "topk:ratio=0.001",
    "sign",
    "qsgd",
)
"""Candidates whose cost is measured ('none' costs nothing by definition). PowerSGD rank 16 is
in the set because the default policy offers it to the adaptive plan."""

_GATHER_PAYLOADS = 2
"""Payloads decoded per all-gather replay; the per-payload time is their mean."""


def eligible(shape: Sequence[int], min_numel: int) -> bool:
    """Whether a layer of ``shape`` is ever compressed by the options the advisor compares.

    The uniform options and the default policy both leave 1-D tensors (biases, norm scales)
    and tensors under ``min_numel`` elements uncompressed, so only these shapes are measured.
    """
    return len(shape) >= 2 and math.prod(int(d) for d in shape) >= min_numel


def _rel_error(compressor: Compressor, grad: torch.Tensor, state: dict) -> float | None:
    """One-step relative error on the gradient, from the (warmed-up) state, no residual."""
    x = grad.to(torch.float32, copy=True)
    norm = float(torch.linalg.vector_norm(x.double()))
    if norm == 0:
        return None
    estimate = compressor.decompress(run_rounds_locally(compressor, x, state), x.shape, state)
    return float(torch.linalg.vector_norm(estimate.double() - x.double())) / norm


class CostMeter:
    """Times every (shape, candidate) on real gradients within a wall-clock budget."""

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Tuning of :class:`CostMeter`."""

        specs: tuple[str, ...] = MEASURED_SPECS
        """Compressor specs to measure."""
        budget_s: float = 20.0
        """Wall-clock budget for all measurements; what does not fit is skipped (and said)."""
        warmup: int = 1
        """Untimed steps per case (first-call allocations, PowerSGD's random start)."""
        reps: int = 5
        """Timed steps per case; the medians are kept."""

        def __post_init__(self) -> None:
            if self.budget_s < 0 or self.warmup < 0 or self.reps < 1:
                raise ValueError("need budget_s >= 0, warmup >= 0 and reps >= 1")

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or CostMeter.Config()
        self.skipped: list[str] = []
        """Cases not measured, with the reason."""

    def measure(
        self,
        grads: Mapping[tuple[int, ...], torch.Tensor],
        progress: Callable[[int, int], None] | None = None,
    ) -> list[CompressorMeasurement]:
        """Measure every spec on every gradient (largest first) until the budget runs out."""
        cfg = self.config
        deadline = time.perf_counter() + cfg.budget_s
        compressors = [build_compressor(spec) for spec in cfg.specs]
        shapes = sorted(grads, key=lambda s: (-math.prod(s), s))
        cases = [(shape, c) for shape in shapes for c in compressors]
        results: list[CompressorMeasurement] = []
        for done, (shape, compressor) in enumerate(cases):
            if progress is not None:
                progress(done, len(cases))
            label = f"{compressor.spec} on {'x'.join(map(str, shape))}"
            if compressor.sends_as_is(torch.Size(shape)):
                continue  # 'none', or sent as 'none' does (``effective_compressor``)
            if time.perf_counter() >= deadline:
                self.skipped.append(f"{label}: compressor budget of {cfg.budget_s:g} s used up")
                continue
            try:
                with torch.no_grad():
                    results.append(self._case(compressor, grads[shape], deadline))
            except Exception as err:  # a compressor bug must not lose the whole profile
                logger.warning("could not measure %s: %s", label, err)
                self.skipped.append(f"{label}: {type(err).__name__}: {err}")
        if progress is not None:
            progress(len(cases), len(cases))
        return results

    def _case(
        self, compressor: Compressor, grad: torch.Tensor, deadline: float
    ) -> CompressorMeasurement:
        shape = torch.Size(grad.shape)
        replay = LayerReplay(compressor, grad, gathered=_GATHER_PAYLOADS)
        for _ in range(self.config.warmup):
            replay.step()
        local: list[float] = []
        decode: list[float] = []
        while len(local) < self.config.reps and (not local or time.perf_counter() < deadline):
            seconds_local, seconds_decode = replay.step()
            local.append(seconds_local)
            decode.append(seconds_decode)
        error = _rel_error(compressor, grad, replay.slot.state)
        return CompressorMeasurement(
            spec=compressor.spec,
            shape=tuple(shape),
            collective=compressor.collective.value,
            wire_bytes=compressor.wire_bytes(shape, grad.dtype),
            local_s=statistics.median(local),
            decode_s=statistics.median(decode),
            reps=len(local),
            rel_error=error,
        )
