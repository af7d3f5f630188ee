"""Before the first step's collectives: time the link, and time the compressors here.

The adaptive loop's opening (:meth:`~autocomp.adaptive.AdaptiveLoop` at step 0) needs one
agreed reading of the link before any gradient has crossed it, so that a link far slower
than the backward is compressed from the first step (``WindowPlanner.open`` decides). The
same timed all-reduce of a zero buffer serves the payoff check's and the link meter's probes
at later boundaries. Rank 0 also times each candidate compressor's real hook path once on the
gradients' device: the cost model's cold-start constants come from another, idle machine.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from autocomp.compressors import Collective, build_compressor
from autocomp.cost_model import CostModel
from autocomp.hook_layer import LayerReplay
from autocomp.link_probe import PROBE_PASSES

logger = logging.getLogger(__name__)

__all__ = [
    "CALIBRATION_SHAPE",
    "OPENING_PROBE_MAX_BYTES",
    "OPENING_PROBE_SECONDS",
    "OPENING_PROBE_START_BYTES",
    "OpeningProbe",
    "ProbeRunner",
    "calibrate",
    "gradient_device",
]

OPENING_PROBE_START_BYTES = 64 * 1024
"""First size of the opening's link probe (per-rank all-reduce payload)."""
OPENING_PROBE_MAX_BYTES = 32 * 1024 * 1024
"""Largest opening probe (and never more than the gradients themselves)."""
OPENING_PROBE_SECONDS = 0.02
"""An opening probe pass this long ends the growth: the transfer dwarfs the latency."""
CALIBRATION_SHAPE = torch.Size([1024, 1024])
"""The gradient shape each candidate is timed on."""


@dataclass(frozen=True, slots=True)
class OpeningProbe:
    """What every rank agreed on at the opening."""

    payload_bytes: int
    """Per-rank all-reduce payload of the timed pass."""
    seconds: float
    """The fastest rank's timed pass (the rank that arrived last did not wait)."""
    slowest_forward_seconds: float
    """The slowest rank's first training forward."""
    forward_missing: bool
    """A rank had no forward time (then the opening decides nothing)."""


class ProbeRunner:
    """Timed all-reduces of one reused zero buffer (the sums stay zero)."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    def time_all_reduce(
        self, payload_bytes: int, device: torch.device, group: dist.ProcessGroup | None
    ) -> float:
        """Seconds of the last of ``PROBE_PASSES`` all-reduces (the first primes the path)."""
        numel = max(1, payload_bytes // 4)
        buffer = self._buffer
        if buffer is None or buffer.numel() < numel or buffer.device != device:
            buffer = torch.zeros(numel, dtype=torch.float32, device=device)
            self._buffer = buffer
        view = buffer[:numel]
        seconds = math.inf
        for _ in range(PROBE_PASSES):
            if view.is_cuda:
                torch.cuda.synchronize(view.device)
            started = time.perf_counter()
            dist.all_reduce(view, group=group)
            if view.is_cuda:
                torch.cuda.synchronize(view.device)
            seconds = time.perf_counter() - started
        return seconds

    def opening(
        self,
        raw_bytes: int,
        forward_seconds: float | None,
        device: torch.device,
        group: dist.ProcessGroup | None,
    ) -> OpeningProbe:
        """Grow the probe from ``OPENING_PROBE_START_BYTES`` by 4x until a timed pass takes
        ``OPENING_PROBE_SECONDS`` (latency is then a rounding error) or it reaches the
        gradients' size (``raw_bytes``): a 64 KB pass reads a 10 Mbit/s link in 50 ms, and a
        loopback link gets a few quick passes. Every rank agrees on each round through one
        small all-reduce, so all stop at the same size."""
        cap = max(OPENING_PROBE_START_BYTES, min(raw_bytes, OPENING_PROBE_MAX_BYTES))
        size = OPENING_PROBE_START_BYTES
        while True:
            seconds = self.time_all_reduce(size, device, group)
            # MAX of -seconds is the minimum; a rank without a forward time vetoes (-1 < 0).
            agreed = torch.tensor(
                [
                    -seconds,
                    -1.0 if forward_seconds is None else forward_seconds,
                    1.0 if forward_seconds is None else 0.0,
                ],
                dtype=torch.float64,
            ).to(device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
            least, slowest_forward, missing = agreed.cpu().tolist()
            if -least >= OPENING_PROBE_SECONDS or size >= cap:
                return OpeningProbe(size, -least, slowest_forward, missing != 0.0)
            size = min(cap, size * 4)


def gradient_device(ddp: torch.nn.Module | None) -> torch.device:
    """Where the gradients live: the profiler's clock and the calibration follow it."""
    if ddp is not None:
        for param in ddp.parameters():
            return param.device
    return torch.device("cpu")


def calibrate(
    cost_model: CostModel, specs: Sequence[str], world_size: int, device: torch.device
) -> None:
    """Time each candidate's real hook path once here, on the gradients' device, at the
    training thread count.

    The cost model's cold-start constants come from another machine and an idle one; without
    this the first decisions try compressors that do not pay, one window each. About a second
    on a 2-core CPU, on rank 0 only.
    """
    generator = torch.Generator().manual_seed(0)
    grad = (torch.randn(CALIBRATION_SHAPE, generator=generator) * 1e-3).to(device)
    for spec in specs:
        compressor = build_compressor(spec)
        if compressor.name == "none":
            continue
        replay = LayerReplay(compressor, grad, gathered=world_size)
        best = math.inf
        for _ in range(3):  # the first call pays one-off costs; keep the fastest
            local, decode = replay.step()
            gathered = compressor.collective is Collective.ALL_GATHER
            best = min(best, local + decode * (world_size if gathered else 1))
        factor = cost_model.calibrate(compressor, CALIBRATION_SHAPE, best)
        logger.debug(
            "autocomp: %s costs %.2f ms per 1M elements here (x%.2f prior)",
            compressor.spec,
            best * 1e3,
            factor,
        )
