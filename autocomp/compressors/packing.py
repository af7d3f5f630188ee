"""Byte-level helpers shared by the quantizing and sparsifying compressors.

All-gather payloads are raw bytes, so a compressor that sends, say, int8 codes plus float32
scales concatenates their bytes into one uint8 tensor and splits them again on receipt.
Sub-byte codes (1, 2 or 4 bits) are packed little-end first within each byte.
"""

from __future__ import annotations

import math

import torch


def to_bytes(*tensors: torch.Tensor) -> torch.Tensor:
    """Concatenate the raw bytes of ``tensors`` into one 1-D uint8 tensor."""
    parts = [t.contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def from_bytes(payload: torch.Tensor, layout: list[tuple[torch.dtype, int]]) -> list[torch.Tensor]:
    """Split a uint8 payload into 1-D tensors of the given (dtype, numel) in order."""
    out: list[torch.Tensor] = []
    offset = 0
    for dtype, numel in layout:
        size = numel * torch.empty((), dtype=dtype).element_size()
        chunk = payload[offset : offset + size]
        if chunk.numel() != size:
            raise ValueError(
                f"payload too short: need {offset + size} bytes, got {payload.numel()}"
            )
        if dtype == torch.uint8:
            out.append(chunk)
        else:
            # A slice of a uint8 tensor may sit at an odd address; copy so view() can reinterpret.
            out.append(chunk.clone().view(dtype) if size else torch.empty(0, dtype=dtype))
        offset += size
    if offset != payload.numel():
        raise ValueError(f"payload has {payload.numel() - offset} unexpected trailing bytes")
    return out


def packed_bytes(numel: int, bits: int) -> int:
    """Bytes needed to hold ``numel`` codes of ``bits`` bits each."""
    return math.ceil(numel * bits / 8)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned codes < 2**bits (bits in 1, 2, 4, 8) into bytes.

    Works in uint8 with one shift-or per code slot, which is ~10x faster on CPU than summing
    widened integers over a short trailing dimension.
    """
    if bits == 8:
        return codes.to(torch.uint8)
    if bits not in (1, 2, 4):
        raise ValueError(f"bits must be 1, 2, 4 or 8, got {bits}")
    per_byte = 8 // bits
    numel = codes.numel()
    padded = torch.zeros(
        math.ceil(numel / per_byte) * per_byte, dtype=torch.uint8, device=codes.device
    )
    padded[:numel] = codes.reshape(-1)
    slots = padded.view(-1, per_byte)
    packed = slots[:, 0].clone()
    for slot in range(1, per_byte):
        packed.bitwise_or_(slots[:, slot] << (slot * bits))
    return packed


def unpack_bits(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: ``numel`` unsigned codes as int32."""
    if bits == 8:
        return packed[:numel].to(torch.int32)
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    codes = torch.empty(packed.numel(), per_byte, dtype=torch.uint8, device=packed.device)
    for slot in range(per_byte):
        torch.bitwise_and(packed >> (slot * bits), mask, out=codes[:, slot])
    return codes.reshape(-1)[:numel].to(torch.int32)


def chunked(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """``x`` flattened and zero-padded into rows of ``chunk`` elements (for per-chunk scales)."""
    flat = x.reshape(-1)
    rows = max(1, math.ceil(flat.numel() / chunk))
    if rows * chunk == flat.numel():
        return flat.view(rows, chunk)
    padded = torch.zeros(rows * chunk, dtype=flat.dtype, device=flat.device)
    padded[: flat.numel()] = flat
    return padded.view(rows, chunk)


def num_chunks(numel: int, chunk: int) -> int:
    """Rows produced by :func:`chunked` (at least one, so 0-element tensors stay well defined)."""
    return max(1, math.ceil(numel / chunk))
