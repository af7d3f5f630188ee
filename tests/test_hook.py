"""Tier 1 (pure unit, no process group): how the comm hook lays out what its all-reduces sum.

A bucket's all-reduce parts of one dtype are summed as one flat tensor. A single part is
summed where it lies: a 16-bit payload of the n-gram model's 8.4M-element table cost a 0.9 ms
copy a step on this machine's CPU (one thread) before it was sent. Several parts, or a part
that is not contiguous, are copied into one new tensor.
"""

from __future__ import annotations

import torch

from autocomp.compressors import build_compressor
from autocomp.hook import _flat, _Part
from autocomp.hook_layer import Encoding, LayerSlot


def _part(payload: torch.Tensor, offset: int = 0) -> _Part:
    slot = LayerSlot("w", torch.Size([payload.numel()]), torch.float32, 0, build_compressor("fp16"))
    return _Part(Encoding(slot, payload.float(), payload, plain=False), offset)


def test_a_single_contiguous_payload_is_summed_in_place() -> None:
    payload = torch.arange(12, dtype=torch.float16)
    flat = _flat([_part(payload)])
    assert flat.data_ptr() == payload.data_ptr()
    flat.add_(1)  # what the all-reduce's sum does to it
    assert payload.tolist() == [float(v + 1) for v in range(12)]


def test_a_matrix_payload_is_flattened_without_a_copy() -> None:
    payload = torch.ones(3, 4)
    flat = _flat([_part(payload)])
    assert flat.shape == (12,) and flat.data_ptr() == payload.data_ptr()


def test_several_parts_are_concatenated_in_order_into_a_new_tensor() -> None:
    first, second = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0, 5.0])
    flat = _flat([_part(first), _part(second, offset=2)])
    assert flat.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    flat.zero_()
    assert first.tolist() == [1.0, 2.0] and second.tolist() == [3.0, 4.0, 5.0]


def test_a_strided_payload_is_copied_contiguous() -> None:
    base = torch.arange(8, dtype=torch.float32)
    payload = base[::2]
    flat = _flat([_part(payload)])
    assert flat.is_contiguous() and flat.tolist() == [0.0, 2.0, 4.0, 6.0]
    flat.zero_()
    assert base.tolist() == [float(v) for v in range(8)]
