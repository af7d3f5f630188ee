"""Cast spans: consecutive layers of a bucket on the same 16-bit cast, encoded and decoded as one.

The hook encodes layer by layer, and on a 16-bit cast (``fp16:ef=false``, ``bf16:ef=false``)
each layer costs a handful of small tensor operations and its Python bookkeeping, both ways:
fixed cost per tensor, not per byte. With every gradient on ``fp16`` the hook took 4.1 ms a
step on the digits ViT's 56 tensors (world size 1, one thread), where one bucket-wide cast
and copy back, as PyTorch's ``fp16_compress_hook`` does them, take 0.13 ms; interleaved
over a 500 Mbit/s link that plan stepped 0.975x plain DDP and PyTorch's hook 0.922x (fifty-first
session, docs/benchmarks-history.md). Where fp16 is the best plan a user can type (500 Mbit/s
to 1 Gbit/s), that overhead was most of the gain.

A span is a run of two or more such layers that lie back to back in the bucket (or one such
layer that fills its bucket). Its float32 slice is cast in one pass, sent as one part of the
bucket's all-reduce, and decoded with one copy. What each layer gets is unchanged:

- the payload is the per-layer payloads concatenated, so the all-reduce sends the same bytes
  in the same order. A cast is elementwise, and when the span's least and largest elements
  lie within the cast's range, the per-layer path's saturation changes nothing and its
  non-finite marker (a subtraction of +0 from the layer's first element) changes no bits;
- a non-finite input still marks only its own layer: the bounds are read on the host (CPU
  only, so the read costs no device sync), and only when they are out of range is the span
  saturated and each layer summed and marked as
  :meth:`~autocomp.compressors.cast.CastCompressor.compress` marks it, bit for bit. (One
  difference remains, on ``bf16`` alone, whose range is float32's: a layer of finite elements
  near 1e38 whose float32 sum overflows is marked by the per-layer path and sent as cast in a
  span);
- the decoded average is checked the same way: a finite sum of the span clears every layer at
  once, and otherwise each layer whose sum is not finite gets its flag, so the hook resets that
  layer alone;
- the encode's and decode's measured time is shared out over the span's layers by size
  (:meth:`~autocomp.profiler.StepProfiler.shared_cost`), so the cost model keeps learning
  per-layer costs.

A bucket that is one span is exchanged as PyTorch's ``fp16_compress_hook`` exchanges a bucket
(:func:`exchange_cast_bucket`), outside the hook's general bucket machinery.

Spans are CPU only (gloo; on CUDA the per-layer path stays, not measured on a GPU), and never
on a sampled step (its norms and errors are per layer), nor for a layer with a residual, error
feedback or a pending uncompressed step. ``tests/test_hook_cast_span.py`` and
``tests/test_hook_multirank.py`` check the bit-identity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from autocomp import callbacks
from autocomp.compressors import Collective
from autocomp.compressors.cast import CastCompressor
from autocomp.hook_layer import Encoding, LayerSlot
from autocomp.hook_state import HookState

__all__ = [
    "CAST_SPANS",
    "CastSpan",
    "decode_cast_span",
    "encode_cast_span",
    "encode_counted",
    "exchange_cast_bucket",
    "fills_bucket",
    "find_cast_spans",
]

_LIMITS: dict[torch.dtype, float] = {}
"""The largest finite value of each wire dtype, read once (``torch.finfo`` costs microseconds
a call on the hook's path)."""

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
    """The bucket's spans of two or more layers, keyed by the index of their first layer,
    and a single layer on a cast that fills the bucket (:func:`exchange_cast_bucket` sends
    it as it sends a whole-bucket span)."""
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
    if run is not None and (len(run.slots) > 1 or run.numel == buffer.numel()):
        spans[run.first] = run
    return spans


def fills_bucket(span: CastSpan, buffer: torch.Tensor) -> bool:
    """The span is the whole bucket (:func:`exchange_cast_bucket` can send it)."""
    return span.offset == 0 and span.numel == buffer.numel()


def encode_cast_span(span: CastSpan, buffer: torch.Tensor, step: int) -> Encoding:
    """The span's one settled encoding (its ``slot`` is the first layer's; the hook treats
    the span as one part of the bucket's all-reduce)."""
    x = buffer[span.offset : span.offset + span.numel]
    limit = _LIMITS.get(span.wire_dtype)
    if limit is None:
        limit = _LIMITS[span.wire_dtype] = torch.finfo(span.wire_dtype).max
    # Within the cast's range (NaN compares false), CastCompressor.compress's saturation
    # changes nothing and its marker subtracts +0 from each layer, which changes no bits: the
    # plain cast is the payload. The bounds are one pass, read on the CPU at no device-sync
    # cost; a float32 sum of the 16-bit cast instead ran at a seventh of a float32 sum's speed
    # (1.8 against 0.24 ms on the MLP LM's 3.4M elements, one thread).
    low, high = torch.aminmax(x)
    if -limit <= low.item() and high.item() <= limit:
        return Encoding(span.slots[0], x, x.to(span.wire_dtype), False, step=step)
    # Something overflows the cast or is not finite: saturate, and mark each layer whose own
    # input sum is not finite as compress marks it (NaN on its first element).
    payload = x.to(span.wire_dtype).clamp_(-limit, limit)
    start = 0
    for slot in span.slots:
        total = x[start : start + slot.numel].sum(dtype=torch.float32)
        payload[start : start + 1].sub_((total - total).to(payload.dtype))
        start += slot.numel
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
    # The float32 sum is finite exactly when every element is (short of bf16 sums near
    # float32's range, which then find each layer finite one by one below).
    if math.isfinite(target.sum(dtype=torch.float32).item()):
        return []
    flags = []
    start = 0
    for slot in span.slots:
        finite = torch.isfinite(target[start : start + slot.numel].sum(dtype=torch.float32))
        if not bool(finite):
            flags.append((slot, finite))
        start += slot.numel
    return flags


def encode_counted(state: HookState, span: CastSpan, buffer: torch.Tensor, step: int) -> Encoding:
    """:func:`encode_cast_span` with the hook's accounting: its time shared out over the
    layers, their bytes counted, and the payload's size checked against what the layers'
    compressors report."""
    profiler = state.profiler
    started = profiler.stamp() if profiler is not None and profiler.time_layers else None
    encoding = encode_cast_span(span, buffer, step)
    if started is not None and profiler is not None:
        profiler.shared_cost([(s.name, s.numel) for s in span.slots], started)
    sent = 0
    for slot in span.slots:
        wire = slot.wire_bytes()
        sent += wire
        slot.bytes_sent += wire
        slot.bytes_raw += slot.numel * slot.dtype.itemsize
    if state.check_wire_bytes:
        produced = encoding.payload.numel() * encoding.payload.element_size()
        if produced != sent:
            raise RuntimeError(
                f"cast span {span.slots[0].name}..{span.slots[-1].name} produced {produced} "
                f"bytes but its compressors report {sent}"
            )
    return encoding


def exchange_cast_bucket(
    state: HookState, span: CastSpan, buffer: torch.Tensor
) -> torch.futures.Future[torch.Tensor]:
    """A bucket that is one span (:func:`fills_bucket`), sent as PyTorch's
    ``fp16_compress_hook`` sends a bucket: one cast, one all-reduce, and one copy back in the
    all-reduce future's own callback, whose future DDP waits for.

    The hook's general path for the same bucket (a work record, a ``collect_all`` over its
    collectives and a hand-completed future) costs the CNN's two such buckets 0.3 ms a step
    more: stepped in turn on one process, static fp16 everywhere stepped 1.17x plain DDP that
    way, 1.12x this way, and PyTorch's hook 1.085x (docs/benchmarks-history.md). The bytes,
    the collective's order and the non-finite handling are the general path's.
    """
    profiler = state.profiler
    step = state.step
    payload = encode_counted(state, span, buffer, step).payload
    fut = dist.all_reduce(payload, group=state.process_group, async_op=True).get_future()
    record = None
    profiled_step = None
    if profiler is not None:
        record = profiler.launched(Collective.ALL_REDUCE, payload.numel() * payload.element_size())
        profiled_step = profiler.current_step
    timer = profiler if profiler is not None and profiler.time_layers else None

    def decode(done: torch.futures.Future) -> torch.Tensor:
        # The collective's end is stamped here, in the one callback DDP needs anyway (the
        # hook's plain path does the same).
        began = profiler.stamp() if profiler is not None else None
        if record is not None:
            record.done = began
        bad = decode_cast_span(span, done.value()[0], buffer)
        if bad:
            state.add_checks([(step, slot, flag) for slot, flag in bad])
        if profiler is not None and began is not None:
            if timer is not None:
                timer.shared_cost([(s.name, s.numel) for s in span.slots], began)
            profiler.bucket_finished(began, profiled_step)
        return buffer

    return callbacks.then(fut, decode)
