"""Latency and bandwidth between the profiling ranks, from a few timed all-reduces.

Run after the script's steps, on every rank together, so that ``recommend`` can compare the
what-if link with the one the profile was taken on and so the profile records what the
measured step times include. All-reduces of growing sizes (1 kB to 16 MB) are timed a few times
each, a barrier before every one so that no rank is charged for another's late arrival; the
samples are then fitted with :class:`autocomp.link_model.BandwidthMeter`, the same robust
alpha-beta fit the adaptive controller uses (lower envelope per size class, Huber regression).
Sizes stop growing when the next one would not fit in the time budget, a decision rank 0 takes
and broadcasts so every rank issues the same collectives.

At the largest size timed, the same two machine costs the adaptive controller's opening
measures are taken too (:class:`autocomp.probe_runner.ProbeRunner`): the compute a transfer takes
from the cores beside it, and what gloo's CPU sum of halves costs beyond its bytes. The
what-if cost model prices hidden transfers and fp16/bf16 all-reduces with them, as the
controller's engine does.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from autocomp.advisor.profile import LinkMeasurement
from autocomp.compressors import Collective
from autocomp.cost_model import HALF_DTYPES_BY_NAME
from autocomp.link_model import BandwidthMeter, latency_hops, link_bytes
from autocomp.probe_runner import ProbeRunner

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_SIZES", "measure_link"]

DEFAULT_SIZES: tuple[int, ...] = tuple(1024 * 4**k for k in range(8))
"""Payload bytes per rank: 1 kB, 4 kB, ..., 16 MB."""


def measure_link(
    *,
    device: torch.device,
    budget_s: float = 5.0,
    reps: int = 5,
    sizes: Sequence[int] = DEFAULT_SIZES,
    group: dist.ProcessGroup | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> LinkMeasurement | None:
    """Time all-reduces on every rank of ``group``; rank 0's fit is returned on every rank.

    Returns None for a single rank. Collective: every rank of the group must call it.
    """
    world = dist.get_world_size(group)
    if world < 2:
        return None
    rank = dist.get_rank(group)
    started = time.perf_counter()
    samples: list[tuple[int, float]] = []
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    last_size_seconds = 0.0
    last_size = 0
    for index, size in enumerate(sizes):
        if rank == 0:
            elapsed = time.perf_counter() - started
            projected = reps * last_size_seconds * 4.5  # next size: ~4x the bytes
            flag.fill_(1 if index == 0 or elapsed + projected <= budget_s else 0)
        dist.broadcast(flag, 0, group=group)
        if int(flag.item()) == 0:
            break
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        times = []
        for _ in range(reps):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            dist.all_reduce(tensor, group=group)
            if tensor.is_cuda:
                torch.cuda.synchronize(tensor.device)
            times.append(time.perf_counter() - t0)
        samples.extend((tensor.numel() * 4, t) for t in times)
        last_size_seconds = min(times)
        last_size = tensor.numel() * 4
        if progress is not None and rank == 0:
            progress(index + 1, len(sizes))
    contention, halves = _machine_costs(last_size, last_size_seconds, device, group)
    fit = _fit(samples, world)
    if fit is None:
        return None
    return dataclasses.replace(
        fit,
        contention_seconds_per_byte=contention,
        half_sum_seconds_per_element=tuple(zip(HALF_DTYPES_BY_NAME, halves, strict=True)),
    )


def _machine_costs(
    payload_bytes: int,
    seconds: float,
    device: torch.device,
    group: dist.ProcessGroup | None,
) -> tuple[float, tuple[float, ...]]:
    """Transfer contention and half-precision sum costs at the largest size timed, agreed
    over the ranks. Every rank gets the same size from the agreed loop above; the time is
    agreed here (the fastest rank's, as in the opening), because the half sums skip their
    collectives on a slow link and every rank must skip alike."""
    agreed = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=group)
    fastest = float(agreed.item())
    runner = ProbeRunner()
    runner.time_all_reduce(payload_bytes, device, group)  # primes the probe buffer's path
    contention = runner.contention(payload_bytes, fastest, device, group)
    halves = runner.half_sums(payload_bytes, fastest, device, group)
    return contention.seconds_per_byte, halves


def _fit(samples: list[tuple[int, float]], world: int) -> LinkMeasurement | None:
    """The controller's robust fit; a plain fit on per-size minima if it declines."""
    meter = BandwidthMeter(BandwidthMeter.Config(min_samples=min(8, max(2, len(samples)))))
    for payload, seconds in samples:
        meter.add(Collective.ALL_REDUCE, payload, world, seconds)
    estimate = meter.end_window()
    if estimate is not None:
        return LinkMeasurement(
            latency_s=estimate.latency_s,
            bandwidth_bytes_per_s=estimate.bandwidth_bytes_per_s,
            rel_residual=estimate.rel_residual,
            method="autocomp.link_model.BandwidthMeter (lower envelope, Huber fit)",
            world_size=world,
            samples=tuple(samples),
        )
    return _simple_fit(samples, world)


def _simple_fit(samples: list[tuple[int, float]], world: int) -> LinkMeasurement | None:
    fastest: dict[int, float] = {}
    for payload, seconds in samples:
        fastest[payload] = min(seconds, fastest.get(payload, float("inf")))
    if len(fastest) < 2:
        return None
    hops = latency_hops(Collective.ALL_REDUCE, world)
    sizes = sorted(fastest)
    small, large = sizes[0], sizes[-1]
    sent_small = link_bytes(Collective.ALL_REDUCE, small, world)
    sent_large = link_bytes(Collective.ALL_REDUCE, large, world)
    per_byte = (fastest[large] - fastest[small]) / max(sent_large - sent_small, 1.0)
    if per_byte <= 0:
        return None
    latency = max(0.0, (fastest[small] - sent_small * per_byte) / hops)
    residuals = [
        abs(fastest[s] - hops * latency - link_bytes(Collective.ALL_REDUCE, s, world) * per_byte)
        / fastest[s]
        for s in sizes
    ]
    residuals.sort()
    return LinkMeasurement(
        latency_s=latency,
        bandwidth_bytes_per_s=1.0 / per_byte,
        rel_residual=residuals[len(residuals) // 2],
        method="two-point fit on the fastest sample per size",
        world_size=world,
        samples=tuple(samples),
    )
