"""Tier 1 (pure unit, no process group): cast spans, consecutive 16-bit cast layers of a bucket
encoded and decoded as one (:mod:`autocomp.hook_cast_span`).

A span's payload must be, bit for bit, the per-layer path's payloads in order (the wire is
unchanged); a non-finite input or average must mark its own layer only; and the spans form only
where every member would take the plain per-layer cast (no residual, error feedback, pending
uncompressed step or sampled step). The 2-rank check that training is bit-identical either way
is in ``tests/test_hook_multirank.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

from autocomp.compressors import build_compressor
from autocomp.hook_cast_span import decode_cast_span, encode_cast_span, find_cast_spans
from autocomp.hook_layer import LayerSlot, _ReplayHookState, begin_encoding, decode_into
from autocomp.profiler import StepProfiler
from autocomp.timing import HostClock

SHAPES = [torch.Size([3, 4]), torch.Size([5]), torch.Size([2, 2, 2]), torch.Size([7])]


def _bucket(specs: list[str]) -> tuple[list[LayerSlot], list[int], torch.Tensor]:
    slots = [
        LayerSlot(f"l{i}", shape, torch.float32, i, build_compressor(spec))
        for i, (shape, spec) in enumerate(zip(SHAPES, specs, strict=True))
    ]
    offsets, at = [], 0
    for slot in slots:
        offsets.append(at)
        at += slot.numel
    torch.manual_seed(0)
    return slots, offsets, torch.randn(at) * 100


def _spans(specs: list[str], **kw: object) -> list[tuple[int, int]]:
    slots, offsets, buffer = _bucket(specs)
    args = {"step": 5, "buffer": buffer, "sampling": False, **kw}
    found = find_cast_spans(slots, offsets, **args)  # type: ignore[arg-type]
    return [(first, len(span.slots)) for first, span in found.items()]


def test_spans_form_over_consecutive_layers_of_one_cast_only() -> None:
    fp16, bf16 = "fp16:ef=false", "bf16:ef=false"
    assert _spans([fp16] * 4) == [(0, 4)]
    assert _spans([fp16, fp16, "none", fp16]) == [(0, 2)]  # a lone layer is no span
    assert _spans([fp16, bf16, bf16, fp16]) == [(1, 2)]  # a dtype change ends a span
    assert _spans([fp16, "fp16", fp16, fp16]) == [(2, 2)]  # error feedback keeps its path
    assert _spans([fp16, "powersgd:rank=1", fp16, fp16]) == [(2, 2)]
    assert _spans([fp16] * 4, sampling=True) == []  # norms and errors are per layer


def test_a_layer_with_state_of_its_own_or_elsewhere_in_the_buffer_stays_out() -> None:
    fp16 = "fp16:ef=false"
    slots, offsets, buffer = _bucket([fp16] * 4)
    slots[1].uncompressed_until = 6  # after a non-finite average: sent plain at step 5
    slots[3].residual = torch.zeros(SHAPES[3])  # a residual left by a compressor before
    found = find_cast_spans(slots, offsets, 5, buffer, False)
    assert found == {}
    slots, offsets, buffer = _bucket([fp16] * 4)
    offsets[2] += 1  # back to back with neither neighbour: layers 0-1 only
    found = find_cast_spans(slots, offsets, 5, buffer, False)
    assert [(f, len(s.slots)) for f, s in found.items()] == [(0, 2)]


def _per_layer(
    slots: list[LayerSlot], buffer: torch.Tensor, offsets: list[int]
) -> tuple[torch.Tensor, list[bool]]:
    state = _ReplayHookState()
    payloads = [
        begin_encoding(slot, buffer[o : o + slot.numel].clone(), state).payload.reshape(-1)
        for slot, o in zip(slots, offsets, strict=True)
    ]
    flat = torch.cat(payloads)
    target = torch.empty_like(buffer)
    flags, at = [], 0
    for slot, o in zip(slots, offsets, strict=True):
        finite = decode_into(slot, flat[at : at + slot.numel], target[o : o + slot.numel])
        flags.append(bool(finite))
        at += slot.numel
    return flat, flags


@pytest.mark.parametrize("spec", ["fp16:ef=false", "bf16:ef=false"])
@pytest.mark.parametrize("bad", [None, math.inf, -math.inf, math.nan, 1e6])
def test_a_span_sends_and_flags_exactly_what_the_layers_would(spec: str, bad: float | None) -> None:
    """Bit-identical payload, decode and per-layer flags, with or without a bad value in layer
    2 (1e6 overflows fp16: saturated and finite, as per layer)."""
    slots, offsets, buffer = _bucket([spec] * 4)
    buffer[0] = -0.0  # a layer's first element: the finite marker must keep its sign
    if bad is not None:
        buffer[offsets[2] + 3] = bad
    expected, expected_flags = _per_layer(slots, buffer, offsets)

    (span,) = find_cast_spans(slots, offsets, 0, buffer, False).values()
    sent = buffer.clone()
    encoding = encode_cast_span(span, sent, step=0)
    assert encoding.payload.dtype == expected.dtype
    assert torch.equal(encoding.payload.view(torch.int16), expected.view(torch.int16))
    assert math.copysign(1.0, encoding.payload[0].item()) == -1.0  # still -0: the plain cast
    received = torch.empty_like(sent)
    bad_layers = decode_cast_span(span, encoding.payload, received)
    flags = [slot.name not in {s.name for s, _ in bad_layers} for slot in slots]
    assert flags == expected_flags
    assert all(not bool(flag) for _, flag in bad_layers)
    if bad is None or bad == 1e6:
        assert bad_layers == []
    else:
        assert [s.name for s, _ in bad_layers] == ["l2"]


def test_shared_cost_splits_one_interval_over_the_layers_by_size() -> None:
    profiler = StepProfiler(HostClock())
    started = profiler.stamp()
    profiler.shared_cost([("a", 1), ("b", 3)], started)
    (a, a0, a1), (b, b0, b1) = profiler._layer_costs
    assert (a, b) == ("a", "b") and a0 == started and a1 == b0
    assert b1 - b0 == pytest.approx(3 * (a1 - a0), rel=1e-3, abs=1e-9)
