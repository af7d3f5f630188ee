"""Cast spans: consecutive layers of a bucket on the same 16-bit cast, encoded and decoded as one.

The hook encodes layer by layer, and on a 16-bit cast (``fp16:ef=false``, ``bf16:ef=false``)
each layer costs a handful of small tensor operations and its Python bookkeeping, both ways:
fixed cost per tensor, not per byte. With every gradient on ``fp16`` the hook took 4.1 ms a
step on the digits ViT's 56 tensors (world size 1, one thread), where one bucket-wide cast
and copy back, as PyTorch's ``fp16_compress_hook`` does them, take 0.13 ms; interleaved
over a 500 Mbit/s link that plan stepped 0.975x plain DDP and PyTorch's hook 0.922x (fifty-first
session, docs/benchmarks-history.md). Where fp16 is the best plan a user can type (500 Mbit/s
to 1 Gbit/s), that overhead was most of the gain.

A span is a run of two or more such layers that lie back to back in the bucket. Its float32
slice is cast and saturated in one pass, sent as one part of the bucket's all-reduce, and
decoded with one copy. What each layer gets is unchanged:

- the payload is the per-layer payloads concatenated (a cast and a clamp are elementwise, and
  each layer's first element gets the per-layer path's ``+ 0`` marker), so the all-reduce
  sends the same bytes in the same order;
- a non-finite input still marks only its own layer: the span's sum is read on the host (CPU
  only, so the read costs no device sync), and only when it is not finite is each layer summed
  and marked as :meth:`~autocomp.compressors.cast.CastCompressor.compress` marks it. (One
  difference remains: a layer of finite elements near 1e32 whose own float32 sum overflows is
  marked by the per-layer path, while in a span whose sum other layers keep finite it is
  saturated to the cast's largest value like any large element);
- the decoded average is checked the same way: a finite sum of the span clears every layer at
  once, and otherwise each layer whose sum is not finite gets its flag, so the hook resets that
  layer alone;
- the encode's and decode's measured time is shared out over the span's layers by size
  (:meth:`~autocomp.profiler.StepProfiler.shared_cost`), so the cost model keeps learning
  per-layer costs.

Spans are CPU only (gloo; on CUDA the per-layer path stays, not measured on a GPU), and never
on a sampled step (its norms and errors are per layer), nor for a layer with a residual, error
feedback or a pending uncompressed step. ``tests/test_hook_cast_span.py`` and
``tests/test_hook_multirank.py`` check the bit-identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from autocomp.compressors.cast import CastCompressor
from autocomp.hook_layer import Encoding, LayerSlot

__all__ = [
    "CAST_SPANS",
    "CastSpan",
    "decode_cast_span",
    "encode_cast_span",
    "find_cast_spans",
]

CAST_SPANS = True
"""Encode consecutive cast layers as one (tests turn it off to compare with the per-layer path)."""


@dataclass(slots=True)
class CastSpan:
    """Consecutive layers of one bucket on the same cast, back to back in its buffer."""

    first: int
    """Index of the span's first layer in the bucket's layout."""
    slots: list[LayerSlot]
    offset: int
    """Element offset of the first layer in the bucket buffer."""
    numel: int
    """Elements of all its layers."""
    wire_dtype: torch.dtype


def _member_dtype(slot: LayerSlot, step: int) -> torch.dtype | None:
    """The wire dtype when ``slot`` may join a span at ``step``, else None."""
    compressor = slot.compressor
    if (
        not isinstance(compressor, CastCompressor)
        or compressor.error_feedback
        or slot.residual is not None
        or slot.sparse
        or step < slot.uncompressed_until
        or slot.dtype != torch.float32
        or slot.numel == 0
    ):
        return None
    return compressor.wire_dtype


def find_cast_spans(
    slots: Sequence[LayerSlot],
    offsets: Sequence[int],
    step: int,
    buffer: torch.Tensor,
    sampling: bool,
) -> dict[int, CastSpan]:
    """The bucket's spans of two or more layers, keyed by the index of their first layer."""
    if not CAST_SPANS or sampling or buffer.is_cuda or buffer.is_sparse:
        return {}
    spans: dict[int, CastSpan] = {}
    run: CastSpan | None = None
    for index, (slot, offset) in enumerate(zip(slots, offsets, strict=True)):
        dtype = _member_dtype(slot, step)
        if (
            run is not None
            and dtype == run.wire_dtype
            and offset == run.offset + run.numel  # back to back in the buffer
        ):
            run.slots.append(slot)
            run.numel += slot.numel
            continue
        if run is not None and len(run.slots) > 1:
            spans[run.first] = run
        run = None if dtype is None else CastSpan(index, [slot], offset, slot.numel, dtype)
    if run is not None and len(run.slots) > 1:
        spans[run.first] = run
    return spans


def encode_cast_span(span: CastSpan, buffer: torch.Tensor, step: int) -> Encoding:
    """The span's one settled encoding (its ``slot`` is the first layer's; the hook treats
    the span as one part of the bucket's all-reduce)."""
    x = buffer[span.offset : span.offset + span.numel]
    limit = torch.finfo(span.wire_dtype).max
    payload = x.to(span.wire_dtype).clamp_(-limit, limit)
    # A layer whose input holds NaN or Inf gets NaN on its first element, as CastCompressor.
    # compress marks it (saturation would turn a real Inf finite). On the CPU a sum is read at
    # once; only a span whose sum is not finite is summed again layer by layer.
    starts = [0]
    for slot in span.slots[:-1]:
        starts.append(starts[-1] + slot.numel)
    if bool(torch.isfinite(x.sum(dtype=torch.float32))):
        # The per-layer marker adds +0 there, which turns a -0 into +0: so does this, so that
        # the payload is the same bits.
        first = torch.tensor(starts, dtype=torch.int64, device=x.device)
        payload.index_add_(0, first, torch.zeros(len(starts), dtype=payload.dtype))
    else:
        for slot, start in zip(span.slots, starts, strict=True):
            total = x[start : start + slot.numel].sum(dtype=torch.float32)
            payload[start : start + 1].add_((total - total).to(payload.dtype))
    return Encoding(span.slots[0], x, payload, False, step=step)


def decode_cast_span(
    span: CastSpan, received: torch.Tensor, buffer: torch.Tensor
) -> list[tuple[LayerSlot, torch.Tensor]]:
    """Write the span's summed payload back into the bucket. Returns the layers whose average
    is not finite, each with its (false) flag for the hook's non-finite check; none when the
    whole span's sum is finite, read at once on the CPU."""
    target = buffer[span.offset : span.offset + span.numel]
    target.copy_(received)
    for slot in span.slots:
        slot.compressor.commit(received, slot.state)  # a cast keeps no state; the contract
    if bool(torch.isfinite(target.sum(dtype=torch.float32))):
        return []
    flags = []
    start = 0
    for slot in span.slots:
        finite = torch.isfinite(target[start : start + slot.numel].sum(dtype=torch.float32))
        if not bool(finite):
            flags.append((slot, finite))
        start += slot.numel
    return flags
