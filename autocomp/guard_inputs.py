"""Tensor helpers that turn gradients and residuals into what the convergence guards are fed.

:mod:`autocomp.guards` is pure logic on numbers; these functions are the torch side: per-layer
L2 norms and non-finite flags, computed on the tensors' device with as few host syncs as
possible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

__all__ = ["layer_norms", "nonfinite_layers", "nonfinite_mask"]


def layer_norms(tensors: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """L2 norm of each tensor, by name, with a single device-to-host copy.

    Half-precision tensors are accumulated in float32 (their squares overflow fp16). Cost: one
    read of every tensor plus one kernel per tensor; all tensors must share a device. Meant for
    window boundaries or per-step accumulation on device, not for every bucket on the host.
    """
    if not tensors:
        return {}
    norms = [
        torch.linalg.vector_norm(
            t.detach(), dtype=torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else None
        ).to(torch.float64)
        for t in tensors.values()
    ]
    return dict(zip(tensors, torch.stack(norms).tolist(), strict=True))


def nonfinite_mask(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Bool tensor on the tensors' device, True where a tensor holds a NaN or an Inf.

    No host synchronisation, so the hook can call it per bucket and OR the masks on device.
    Each tensor is summed in float64: a NaN or Inf makes the sum non-finite, while finite
    fp32/fp16/bf16 values cannot overflow a float64 sum, so the test is exact (float64 inputs
    beyond ~1e300 could overflow: a harmless false positive). Cost: one read pass per tensor,
    no temporaries (``isfinite(t).all()`` would also write a bool per element), one kernel per
    tensor plus two. On MPS, which has no float64, the elementwise test is used instead.
    """
    if not tensors:
        return torch.zeros(0, dtype=torch.bool)
    if tensors[0].device.type == "mps":
        return torch.stack([torch.isfinite(t.detach()).all().logical_not() for t in tensors])
    sums = torch.stack([t.detach().sum(dtype=torch.float64) for t in tensors])
    return torch.isfinite(sums).logical_not()


def nonfinite_layers(tensors: Mapping[str, torch.Tensor]) -> dict[str, bool]:
    """``{name: True if the tensor holds NaN/Inf}``: :func:`nonfinite_mask` + one host sync."""
    if not tensors:
        return {}
    flags = nonfinite_mask(list(tensors.values())).tolist()
    return dict(zip(tensors, flags, strict=True))
