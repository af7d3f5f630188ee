"""Clocks for the profiler: host time on CPU, CUDA events on GPUs.

The profiler never does arithmetic on a time point when it takes it. It takes *stamps* from a
clock and turns them into seconds once per window, when the clock says they can be read:

- :class:`HostClock` (CPU tensors, gloo): a stamp is ``time.perf_counter()``, readable at once.
  Collective completions are stamped in completion callbacks, which gloo runs when the transfer
  has finished.
- :class:`CudaClock` (CUDA tensors, NCCL or gloo): a stamp is a ``torch.cuda.Event`` recorded on
  the current stream. Host time means nothing there: NCCL marks a collective's future complete
  when it is enqueued, and kernels run long after the Python that launched them returned. A
  completion callback runs on a stream made to wait for the collective, so an event recorded in
  it completes when the transfer does; an event recorded in the hook completes when the
  gradients it follows exist. Events are read (``elapsed_time`` against an anchor) only once
  they have completed (``query()``, which does not block), so reading a window never
  synchronizes the host with the device; steps whose events are still in flight are read at
  the next window instead.

:func:`clock_for` picks the clock from the parameters' device.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol

import torch

now = time.perf_counter
"""The host clock (a module attribute, so a test can script it)."""

Stamp = float | torch.cuda.Event
"""A time point as a clock takes it: seconds (host), or a recorded CUDA event."""


class Clock(Protocol):
    """Takes stamps now and turns them into seconds later."""

    on_device: bool
    """True when stamps are device events (their reading is deferred until they complete)."""

    def stamp(self) -> Stamp:
        """A time point at the current position of the work (host: now; CUDA: the stream)."""
        ...

    def ready(self, stamps: Iterable[Stamp | None]) -> bool:
        """Whether every stamp can be read without blocking."""
        ...

    def reader(self, anchor: Stamp) -> StampReader:
        """Something that turns ready stamps into seconds on one axis, with ``anchor`` at 0."""
        ...


class StampReader(Protocol):
    def __call__(self, stamp: Stamp) -> float: ...


class HostClock:
    """``time.perf_counter``: what the host sees, right for CPU work and gloo."""

    on_device = False

    def stamp(self) -> float:
        return now()

    def ready(self, stamps: Iterable[Stamp | None]) -> bool:
        return True

    def reader(self, anchor: Stamp) -> StampReader:
        def read(stamp: Stamp) -> float:
            assert isinstance(stamp, float)
            return stamp

        return read


class CudaClock:
    """CUDA events on the current stream of one device: what the device did, and when."""

    on_device = True

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"CudaClock needs a CUDA device, not {device}")
        self.device = device

    def stamp(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def ready(self, stamps: Iterable[Stamp | None]) -> bool:
        return all(s is None or isinstance(s, float) or s.query() for s in stamps)

    def reader(self, anchor: Stamp) -> StampReader:
        if not isinstance(anchor, torch.cuda.Event):
            raise TypeError("a CUDA clock reads its stamps against one of its own events")

        def read(stamp: Stamp) -> float:
            assert isinstance(stamp, torch.cuda.Event)
            return anchor.elapsed_time(stamp) / 1e3

        return read


def clock_for(device: torch.device) -> Clock:
    """The clock that measures work on ``device``."""
    if device.type == "cuda":
        return CudaClock(device)
    return HostClock()


def elapsed(clock: Clock, start: Stamp, end: Stamp) -> float:
    """Seconds between two stamps, waiting for them on a device (calibration, not hot paths)."""
    if isinstance(end, torch.cuda.Event):
        end.synchronize()
    return clock.reader(start)(end) - clock.reader(start)(start)
