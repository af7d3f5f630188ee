"""Identity and low-precision casts: ``none``, ``fp16``, ``bf16``.

These stay summable, so they ride the bucket's all-reduce. Casting rounds to nearest, which is
biased, so by default the rounding error is fed back into the next step (``ef=false`` turns it
off and saves one float32 residual per parameter).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from autocomp.compressors.base import Collective, Compressor, Param, register_compressor


@register_compressor
class NoCompression(Compressor):
    """Plain averaging all-reduce of the gradient in its own dtype."""

    name: ClassVar[str] = "none"
    collective: ClassVar[Collective] = Collective.ALL_REDUCE
    decode_share: ClassVar[float] = 0.0

    @property
    def biased(self) -> bool:
        return False

    def payload_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def wire_bytes(
        self, shape: torch.Size, dtype: torch.dtype, state: dict[str, Any] | None = None
    ) -> int:
        return shape.numel() * dtype.itemsize

    def compress(self, x: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        return x.reshape(-1)

    def decompress(
        self, payload: torch.Tensor, shape: torch.Size, state: dict[str, Any]
    ) -> torch.Tensor:
        return payload.reshape(shape)

    def sends_as_is(self, shape: torch.Size) -> bool:
        return True


def effective_compressor(compressor: Compressor, shape: torch.Size) -> Compressor:
    """What the hook runs for ``compressor`` on a tensor of ``shape``: ``none`` when the
    compressor would send it whole anyway (:meth:`Compressor.sends_as_is`).

    Such a tensor then rides in its bucket's plain all-reduce in its own dtype, with no
    float32 copy, compressor state or (all-zero) residual. PowerSGD's own path for them
    costs 20-40 us per tensor replayed alone (minimum to median), 2-4 ms a step for the 98
    biases and norms of a 12-layer GPT, which the engine had priced at 22 ms (2026-11-29,
    docs/benchmarks-history.md). ``HookState.assign``, the engine's pins, the advisor's what-if and
    the checkpoint's plan check go through this function; the cost prior charges such
    tensors no work."""
    if type(compressor) is not NoCompression and compressor.sends_as_is(torch.Size(shape)):
        return NoCompression()
    return compressor


_EF = Param("ef", bool, True, doc="feed the rounding error back into the next step")


class CastCompressor(Compressor):
    """Round to a 16-bit float type; sums in that type on the wire."""

    collective: ClassVar[Collective] = Collective.ALL_REDUCE
    params: ClassVar[tuple[Param, ...]] = (_EF,)
    wire_dtype: ClassVar[torch.dtype]

    def work_shares(self, shape: torch.Size) -> tuple[float, float]:
        # Measured: the decode (a cast back) is 0.37 of the work; 0.21 with error feedback,
        # whose residual update makes the encode longer.
        return (0.0, 0.21 if self.error_feedback else 0.37)

    def payload_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.wire_dtype

    def wire_bytes(
        self, shape: torch.Size, dtype: torch.dtype, state: dict[str, Any] | None = None
    ) -> int:
        return shape.numel() * self.wire_dtype.itemsize

    def compress(self, x: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        limit = torch.finfo(self.wire_dtype).max
        # Cast, then saturate in the half-size result: a finite gradient that overflows 16
        # bits stays finite. (The 16-bit sum over ranks can still overflow; the hook then sees
        # a non-finite average and resets.) NaN stays NaN.
        payload = x.reshape(-1).to(self.wire_dtype).clamp_(-limit, limit)
        if payload.numel():
            # Saturation would also turn a real Inf into a finite number, which AMP's
            # GradScaler must see to skip the step. A non-finite input makes the first element
            # NaN instead, without a host sync: the hook's check then catches it. A finite
            # input subtracts +0, which leaves every value's bits as they are (-0 included, which
            # adding +0 would turn into +0): the payload is then the plain cast, as a cast of
            # many layers at once (the hook's cast spans) produces it.
            total = x.sum(dtype=torch.float32)
            payload[:1].sub_((total - total).to(payload.dtype))
        return payload

    def decompress(
        self, payload: torch.Tensor, shape: torch.Size, state: dict[str, Any]
    ) -> torch.Tensor:
        return payload.to(torch.float32).reshape(shape)

    def subtract_estimate_(
        self, x: torch.Tensor, payload: torch.Tensor, state: dict[str, Any]
    ) -> torch.Tensor:
        return x.sub_(payload.view(x.shape))  # upcasts on the fly: no float32 temporary

    def decompress_into(
        self,
        received: torch.Tensor | list[torch.Tensor],
        out: torch.Tensor,
        shape: torch.Size,
        state: dict[str, Any],
    ) -> None:
        out.copy_(received)  # type: ignore[arg-type]  # all-reduce: one summed payload


@register_compressor
class Float16(CastCompressor):
    """IEEE half precision: 2 bytes per element, ~3 significant decimal digits."""

    name: ClassVar[str] = "fp16"
    wire_dtype: ClassVar[torch.dtype] = torch.float16


@register_compressor
class BFloat16(CastCompressor):
    """bfloat16: float32's range with 8 mantissa bits; never overflows where float32 does not."""

    name: ClassVar[str] = "bf16"
    wire_dtype: ClassVar[torch.dtype] = torch.bfloat16
