"""The relative error of the averaged update, estimated from each rank's sketch of its residual.

Why: what the optimizer receives is the average over ranks of the decoded payloads, and its
error is the mean of the ranks' residuals (``x_r - C(x_r)``; for PowerSGD the estimate is
shared, so the same holds). The hook sees only its own rank's residual, and against that
rank's own input it also counts the rank's deviation from the mean as error: with PowerSGD at
rank 4 on two ranks, the per-rank reading is 0.77 (L1-weighted e^2) on the in-repo GPT and 0.75
on the held-out 12-layer GPT, while the averaged update's error is 0.37 and 0.18
(docs/benchmarks-history.md, "PowerSGD's 1-D tensors sent as ``none``", thirtieth session).
Models whose price of error differs by 3x read the same, so the reading cannot rank them.

Sending the residuals would cost as much as the gradients. A sketch is linear, so the sum over
ranks of each rank's sketch is the sketch of the summed residual. Every rank sketches its
residual and its input with the same random signs on a sampled step; the window's summing
all-reduce adds them up; ``|S(sum residual)|^2 / |S(sum input)|^2`` then estimates the averaged
update's squared relative error. The sketch folds the flat tensor into rows of ``b`` elements
(``b`` a prime that divides none of the tensor's trailing dimension products, so a matrix's
columns spread over the buckets) and sums the rows with a random sign per row:
``E|S v|^2 = |v|^2`` for any ``v``, with a relative spread of about ``sqrt(2 / b)`` (0.18) per
sketch. One random sign per ``b`` elements and one matrix-vector product make it about 0.3 ms
per million elements on one CPU core, 30x cheaper than a sign per element; it runs on sampled
steps only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "SKETCH_WIDTH",
    "averaged_error",
    "sign_sketch",
    "sketch_buckets",
    "sketch_seed",
]

_BUCKET_PRIMES = (61, 59, 53, 47, 43, 41, 37, 31)
SKETCH_WIDTH = _BUCKET_PRIMES[0]
"""Floats per sketch in the window vector (the largest bucket count)."""


def sketch_buckets(shape: Sequence[int]) -> int:
    """Buckets to fold a tensor of ``shape`` into: the first prime of the list that divides
    none of its trailing dimension products (the whole tensor's size is not one). A row
    length that is a multiple of the bucket count would stack a matrix's columns into the
    same buckets, and rows that repeat (a broadcast bias gradient, a tied structure) would
    then cancel or add up by their signs alone."""
    periods = []  # the row lengths of every view that folds trailing dimensions together
    product = 1
    for size in reversed(tuple(shape)[1:]):
        product *= int(size)
        periods.append(product)
    for prime in _BUCKET_PRIMES:
        if all(period % prime for period in periods):
            return prime
    return _BUCKET_PRIMES[0]  # every prime divides a period: unbiased still, only noisier


def sketch_seed(layer_seed: int, step: int) -> int:
    """The signs' seed for one layer on one step, identical on every rank. A new seed each step
    keeps a window's sketches of different steps independent: their cross terms then vanish in
    expectation, so the pooled sketch estimates the sum of the steps' squared norms."""
    return (int(layer_seed) * 1_000_003 + int(step) * 7_919 + 0x5EED) % (2**62)


def sign_sketch(vectors: Sequence[torch.Tensor], seed: int, buckets: int) -> torch.Tensor:
    """Sketches of ``vectors`` (same number of elements each) with shared signs, as a float32
    ``(len(vectors), SKETCH_WIDTH)`` tensor on their device (slots past ``buckets`` are 0)."""
    if not 0 < buckets <= SKETCH_WIDTH:
        raise ValueError(f"buckets must be in [1, {SKETCH_WIDTH}], got {buckets}")
    first = vectors[0]
    numel, device = first.numel(), first.device
    rows, tail = divmod(numel, buckets)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    signs = torch.randint(0, 2, (rows + 1,), generator=generator, device=device)
    signs = signs.to(torch.float32).mul_(2).sub_(1)
    out = torch.zeros((len(vectors), SKETCH_WIDTH), dtype=torch.float32, device=device)
    for i, vector in enumerate(vectors):
        if vector.numel() != numel:
            raise ValueError("sketched vectors must have the same number of elements")
        flat = vector.detach().reshape(-1).to(torch.float32)
        if rows:
            out[i, :buckets] = signs[:rows] @ flat[: rows * buckets].view(rows, buckets)
        if tail:
            out[i, :tail] += signs[rows] * flat[rows * buckets :]
    return out


def averaged_error(lost_squares: float, input_squares: float) -> float | None:
    """The averaged update's relative error from the squared norms of the ranks' summed
    sketches, each summed over steps (None when the input's is 0: nothing to compare with)."""
    if not (input_squares > 0 and math.isfinite(input_squares) and math.isfinite(lost_squares)):
        return None
    return math.sqrt(lost_squares / input_squares)
