"""Shared marks and helpers of the CUDA tests (``tests/gpu``)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

NO_CUDA = (
    "no CUDA device (torch.cuda.is_available() is False): GPU check skipped; "
    "run `make gpu-check` on a machine with an NVIDIA GPU"
)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
"""Skip without a usable CUDA device, saying so."""


def _nccl_missing() -> str | None:
    """Why an NCCL test cannot run here (no GPU first: that is the usual reason), or None."""
    if not torch.cuda.is_available():
        return NO_CUDA
    if not (dist.is_available() and dist.is_nccl_available()):
        return "this torch build has no NCCL backend: NCCL check skipped"
    return None


requires_nccl = pytest.mark.skipif(_nccl_missing() is not None, reason=_nccl_missing() or "")

GPU_MARKS = [pytest.mark.gpu, requires_cuda]
"""``pytestmark`` of every module here: collected by ``-m gpu``, skipped without CUDA."""


def spin_cycles(device: torch.device, seconds: float) -> int:
    """GPU clock cycles for which ``torch.cuda._sleep`` keeps ``device`` busy ~``seconds``.

    The tests need device work of a known length that costs the host nothing to launch (a
    spinning kernel), to tell device time from host time. Clock rates differ between GPUs and
    boost states, so the rate is measured here with CUDA events.
    """
    probe = 20_000_000
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(device):
        torch.cuda._sleep(probe)  # the first launch may pay one-off costs
        start.record()
        torch.cuda._sleep(probe)
        end.record()
        end.synchronize()
    per_cycle = start.elapsed_time(end) / 1e3 / probe
    return max(1, int(seconds / max(per_cycle, 1e-12)))
