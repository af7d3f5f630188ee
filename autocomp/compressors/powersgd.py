"""PowerSGD low-rank compression with one all-reduce per step (alternating P and Q).

Classic PowerSGD (Vogels et al. 2019) needs two dependent all-reduces per step: P = M Q, then
Q = M^T P. PyTorch's hook launches the second one from a future callback, whose order is not
the same on every rank when a model has several buckets, which gloo rejects (size mismatch).

Here, as in ACP-SGD (Zhang et al. 2023), each step sends only one factor and reuses the other
from the previous step, which every rank already holds identically:

- P step: Q_hat = orth(Q_prev);  send P_i = M_i Q_hat;  estimate = (sum P_i) Q_hat^T
- Q step: P_hat = orth(P_prev);  send Q_i = M_i^T P_hat; estimate = P_hat (sum Q_i)^T

Both estimates are projections of the averaged gradient, so the payload is summable and rides
the bucket's single all-reduce; the factors stay warm across steps, and on a fixed rank-r
matrix the estimate is exact from the second step on. Tensors that cannot be compressed (1-D,
or rank >= min(rows, cols)) are sent as they are.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from autocomp.compressors.base import Collective, Compressor, Param, register_compressor

_P_STEP, _Q_STEP = 0, 1


def matrix_shape(shape: torch.Size) -> tuple[int, int]:
    """How a gradient is viewed as a matrix: first dim by the product of the rest."""
    if len(shape) < 2:
        return (shape.numel(), 1)
    return (shape[0], shape.numel() // shape[0] if shape[0] else 0)


def _orthonormalize(matrix: torch.Tensor) -> torch.Tensor:
    # Reduced QR: deterministic for identical inputs, so every rank gets the same basis.
    return torch.linalg.qr(matrix, mode="reduced").Q


@register_compressor
class PowerSGD(Compressor):
    """Rank-``rank`` approximation via alternating power iteration, warm-started."""

    name: ClassVar[str] = "powersgd"
    collective: ClassVar[Collective] = Collective.ALL_REDUCE
    params: ClassVar[tuple[Param, ...]] = (
        Param("rank", int, 4, low=1, high=1024, doc="rank of the approximation"),
        Param("ef", bool, True, doc="feed the approximation error back into the next step"),
    )

    def compresses(self, shape: torch.Size) -> bool:
        """False for tensors sent uncompressed (1-D, or too thin for the rank)."""
        rows, cols = matrix_shape(shape)
        return len(shape) >= 2 and int(self.config["rank"]) < min(rows, cols)

    def wire_bytes(
        self, shape: torch.Size, dtype: torch.dtype, state: dict[str, Any] | None = None
    ) -> int:
        if not self.compresses(shape):
            return shape.numel() * 4
        rows, cols = matrix_shape(shape)
        rank = int(self.config["rank"])
        if state is None:
            return (rows + cols) * rank * 4 // 2
        return (rows if state["phase"] == _P_STEP else cols) * rank * 4

    def init_state(self, shape: torch.Size, seed: int, rank: int) -> dict[str, Any]:
        if not self.compresses(shape):
            return {}
        _, cols = matrix_shape(shape)
        generator = torch.Generator()
        generator.manual_seed(seed % (1 << 63))
        # Same seed on every rank: the first Q is shared without any communication.
        q = torch.randn(cols, int(self.config["rank"]), generator=generator)
        return {"phase": _P_STEP, "p": None, "q": q}

    def compress(self, x: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        if not self.compresses(x.shape):
            return x.reshape(-1).to(torch.float32)
        matrix = x.reshape(matrix_shape(x.shape))
        if state["phase"] == _P_STEP:
            basis = _orthonormalize(state["q"].to(matrix.device))
            payload = matrix @ basis
        else:
            basis = _orthonormalize(state["p"].to(matrix.device))
            # (basis^T M)^T, not M^T basis: BLAS on a transposed operand with 2-8 columns
            # falls off its fast path on CPU (46-110 ms instead of 3 ms for 3072x3072).
            payload = (basis.T @ matrix).T.contiguous()
        state["_basis"] = basis
        return payload.reshape(-1)

    def decompress(
        self, payload: torch.Tensor, shape: torch.Size, state: dict[str, Any]
    ) -> torch.Tensor:
        if not self.compresses(shape):
            return payload.reshape(shape)
        rows, cols = matrix_shape(shape)
        rank = int(self.config["rank"])
        basis = state["_basis"]
        if state["phase"] == _P_STEP:
            estimate = payload.reshape(rows, rank) @ basis.T
        else:
            estimate = basis @ payload.reshape(cols, rank).T
        return estimate.reshape(shape)

    def subtract_estimate_(
        self, x: torch.Tensor, payload: torch.Tensor, state: dict[str, Any]
    ) -> torch.Tensor:
        if not self.compresses(x.shape):
            return x.sub_(payload.reshape(x.shape))
        # One fused pass instead of building the full-size estimate and subtracting it.
        rows, cols = matrix_shape(x.shape)
        rank = int(self.config["rank"])
        matrix = x.view(rows, cols)
        basis = state["_basis"]
        if state["phase"] == _P_STEP:
            matrix.addmm_(payload.view(rows, rank), basis.T, alpha=-1.0)
        else:
            matrix.addmm_(basis, payload.view(cols, rank).T, alpha=-1.0)
        return x

    def decompress_into(
        self,
        received: torch.Tensor | list[torch.Tensor],
        out: torch.Tensor,
        shape: torch.Size,
        state: dict[str, Any],
    ) -> None:
        assert isinstance(received, torch.Tensor)
        if not self.compresses(shape) or out.dtype != torch.float32:
            out.copy_(self.decompress(received, shape, state).reshape(-1))
            return
        rows, cols = matrix_shape(shape)
        rank = int(self.config["rank"])
        basis = state["_basis"]
        target = out.view(rows, cols)
        if state["phase"] == _P_STEP:
            torch.mm(received.view(rows, rank), basis.T, out=target)
        else:
            torch.mm(basis, received.view(cols, rank).T, out=target)

    def commit(self, payload: torch.Tensor | list[torch.Tensor], state: dict[str, Any]) -> None:
        if not state:
            return
        assert isinstance(payload, torch.Tensor)
        rank = int(self.config["rank"])
        factor = payload.detach().reshape(-1, rank).clone()
        if state["phase"] == _P_STEP:
            state["p"] = factor
        else:
            state["q"] = factor
        state["phase"] ^= 1
        state.pop("_basis", None)
