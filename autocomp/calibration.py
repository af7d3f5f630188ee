"""Time each candidate compressor's real hook path on this machine, once, at ``wrap``.

The cost model's cold-start constants come from another machine and an idle one; without this
the first decisions try compressors that do not pay, one window each. Rank 0 replays each
candidate's encode and decode (no collectives) on the gradients' device, at the training thread
count, and scales the cost model's prices by what it measured (``CostModel.calibrate``).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from autocomp.compressors import Collective, build_compressor
from autocomp.cost_model import CostModel
from autocomp.hook_layer import LayerReplay

logger = logging.getLogger(__name__)

__all__ = ["CALIBRATION_SHAPE", "calibrate", "calibration_shape_for"]

CALIBRATION_SHAPE = torch.Size([1024, 1024])
"""The gradient shape each candidate is timed on."""
LARGE_CALIBRATION_MIN_RATIO = 2
"""A model whose largest matrix has at least this many times ``CALIBRATION_SHAPE``'s
elements has its candidates timed on that matrix too (``calibrate``). Per element, fp16 cost
2.3x on 2M elements what it cost on 1M here, top-k 1.6x."""
LARGE_CALIBRATION_MAX_NUMEL = 1 << 24
"""The most elements the large calibration times (rows are cut to fit): past caches, the
cost per element stops growing (8.4M and 16.8M elements cost alike per element here), and
a 64 MB matrix per candidate is already a large share of the set-up."""
LARGE_CALIBRATION_CALLS = 2
"""Calls per candidate on the large shape; the faster counts (the first paid 3x on fp16 on
8.4M elements, its pages touched for the first time)."""
LARGE_CALIBRATION_SECONDS = 0.25
"""Budget of the large calibration at ``wrap``, rank 0. On the n-gram task's table it times
fp16 and PowerSGD ranks 4 and 16 (about 0.2 s) and leaves out int8 and top-k (0.7 and
0.45 s there), which are then priced at the median growth the others measured."""


def calibration_shape_for(shapes: Sequence[torch.Size]) -> torch.Size | None:
    """The second size :func:`calibrate` times, from the wrapped gradients' ``shapes``: the
    largest matrix's shape (rows cut to stay within ``LARGE_CALIBRATION_MAX_NUMEL``), or None
    when no matrix has ``LARGE_CALIBRATION_MIN_RATIO`` times ``CALIBRATION_SHAPE``'s elements."""
    matrices = [torch.Size(shape) for shape in shapes if len(shape) >= 2 and shape.numel() > 0]
    if not matrices:
        return None
    largest = max(matrices, key=lambda shape: shape.numel())
    if largest.numel() < LARGE_CALIBRATION_MIN_RATIO * CALIBRATION_SHAPE.numel():
        return None
    columns = math.prod(largest[1:])
    rows = min(largest[0], max(1, LARGE_CALIBRATION_MAX_NUMEL // columns))
    return torch.Size([rows, *largest[1:]])


def _replay_seconds(compressor: Any, grad: torch.Tensor, world_size: int, calls: int) -> float:
    """The fastest of ``calls`` replays of the hook's work on ``grad`` (the first call pays
    one-off costs: allocations, first touches)."""
    replay = LayerReplay(compressor, grad, gathered=world_size)
    gathered = compressor.collective is Collective.ALL_GATHER
    best = math.inf
    for _ in range(calls):
        local, decode = replay.step()
        best = min(best, local + decode * (world_size if gathered else 1))
    return best


def calibrate(
    cost_model: CostModel,
    specs: Sequence[str],
    world_size: int,
    device: torch.device,
    large_shape: torch.Size | None = None,
    budget_seconds: float = LARGE_CALIBRATION_SECONDS,
) -> list[str]:
    """Time each candidate's real hook path here, on the gradients' device, at the training
    thread count; returns the specs also timed on ``large_shape``.

    The cost model's cold-start constants come from another machine and an idle one; without
    this the first decisions try compressors that do not pay, one window each. Each candidate
    is timed on ``CALIBRATION_SHAPE`` (1M elements), on rank 0 only, about 0.1 s on a 2-core
    CPU.

    ``large_shape`` (:func:`calibration_shape_for`): the model's largest matrix, where a
    price per element from 1M elements runs low. On the n-gram task's 131072 x 64 table the
    calibrated prior priced fp16 at 4.5-6.0 ms a step and int8 at 48 ms, where the hook
    measured 15 and 353 ms in training (2 ranks on 2 cores), and the policy put the table on
    fp16 on loopback. Each candidate is timed there too, cheapest first, while the estimate
    of its two calls (its 1M time scaled by the elements and by the largest growth per
    element seen so far) fits in what is left of ``budget_seconds``. A candidate left out is
    priced on that shape at the median growth per element measured there (with none
    measured, its 1M factor holds at every size).
    """
    generator = torch.Generator().manual_seed(0)
    grad = (torch.randn(CALIBRATION_SHAPE, generator=generator) * 1e-3).to(device)
    timed: list[tuple[float, Any]] = []
    for spec in specs:
        compressor = build_compressor(spec)
        if compressor.name == "none":
            continue
        best = _replay_seconds(compressor, grad, world_size, calls=3)
        factor = cost_model.calibrate(compressor, CALIBRATION_SHAPE, best)
        timed.append((best, compressor))
        logger.debug(
            "autocomp: %s costs %.2f ms per 1M elements here (x%.2f prior)",
            compressor.spec,
            best * 1e3,
            factor,
        )
    if large_shape is None or not timed:
        return []
    del grad
    large = (torch.randn(large_shape, generator=generator) * 1e-3).to(device)
    elements = large_shape.numel() / CALIBRATION_SHAPE.numel()
    growths: list[float] = []  # per candidate timed: its cost per element over its 1M one
    started = time.perf_counter()
    done: list[str] = []
    left_out: list[tuple[float, Any]] = []
    for small, compressor in sorted(timed, key=lambda item: item[0]):
        estimate = LARGE_CALIBRATION_CALLS * small * elements * max([1.0, *growths])
        if time.perf_counter() - started + estimate > budget_seconds:
            left_out.append((small, compressor))
            continue
        seconds = _replay_seconds(compressor, large, world_size, calls=LARGE_CALIBRATION_CALLS)
        growths.append(seconds / (small * elements))
        factor = cost_model.calibrate(compressor, large_shape, seconds)
        done.append(compressor.spec)
        logger.debug(
            "autocomp: %s costs %.2f ms on %s here, %.2fx its cost per element on 1M (x%.2f prior)",
            compressor.spec,
            seconds * 1e3,
            tuple(large_shape),
            seconds / (small * elements),
            factor,
        )
    typical = statistics.median(growths) if growths else 1.0
    for small, compressor in left_out if growths else []:
        # Not timed: priced at the median growth per element measured on this shape (on the
        # n-gram table fp16 grew 1.7-2.0x, PowerSGD rank 4 1.2x, rank 16 1.75x; top-k, left
        # out, 2.25x dense). At its 1M cost per element instead, top-k on that table's 0.56%
        # of nonzero rows was priced at 38 ms against none's 42 ms, where training measured
        # 62 ms, and the look at step 1 put the table on top-k on loopback.
        factor = cost_model.calibrate(compressor, large_shape, small * elements * typical)
        logger.debug(
            "autocomp: %s not timed on %s (over the calibration budget); priced at %.2fx its "
            "cost per element on 1M (x%.2f prior)",
            compressor.spec,
            tuple(large_shape),
            typical,
            factor,
        )
    return done
