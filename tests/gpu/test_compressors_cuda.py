"""Tier 4 (GPU): every compressor on CUDA tensors, against its CPU result where deterministic.

The compressors are written device-agnostic (payloads, generators and warm-start factors
follow the gradient's device), but the suite runs them on CPU only. Here:

- deterministic compressors (none, fp16, bf16, int8, sign, topk, powersgd with its seeded
  first factor) decode, step after step, to what the CPU decodes from the same input and seed:
  bit for bit where the math is exact (casts, selection, int8's scale as a multiply by
  1/127: a division by a Python scalar rounded an ulp apart on CPU and CUDA, H100 2026-11-24),
  within float rounding otherwise (sign's chunk norms, PowerSGD's matmuls and QR);
- random ones (qsgd, randomk) keep the contract on CUDA: payload on the device with the
  reported size and dtype, a state re-created from the same seed replays the same draws,
  randomk's ranks pick the same coordinates, and both stay unbiased in expectation;
- the hook's per-layer path on CUDA (:func:`autocomp.hook.encode_locally`, ``decode_into``):
  the error-feedback invariant holds and a NaN/Inf average is flagged.

Skipped without CUDA (see ``tests/gpu/cuda.py``).
"""

from __future__ import annotations

import math
import types
from typing import Any

import pytest
import torch

from autocomp.compressors import Collective, build_compressor, run_rounds_locally
from autocomp.hook_layer import LayerSlot, decode_into, encode_locally
from tests.gpu.cuda import GPU_MARKS

pytestmark = [*GPU_MARKS, pytest.mark.timeout(300)]

CUDA = torch.device("cuda")

# spec -> how close the CUDA result must be to the CPU one
EXACT, CLOSE = "exact", "close"
DETERMINISTIC = {
    "none": EXACT,
    "fp16": EXACT,
    "fp16:ef=false": EXACT,
    "bf16": EXACT,
    "topk:ratio=0.1": EXACT,
    "topk:ratio=0.5": EXACT,
    "int8": EXACT,
    "int8:chunk=3": EXACT,
    "sign": CLOSE,
    "sign:chunk=5": CLOSE,
    "powersgd:rank=1": CLOSE,
    "powersgd:rank=4": CLOSE,
}
SHAPES = [(1,), (37,), (64, 48), (48, 64), (16, 4, 3, 3), (8, 1, 1, 1)]
RANDOM_SPECS = ["qsgd", "qsgd:levels=1,chunk=16", "randomk:ratio=0.25", "randomk:ratio=0.05"]
STEPS = 4


def gradient(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A CPU tensor with a low-rank part and noise, distinct magnitudes (no topk ties)."""
    gen = torch.Generator().manual_seed(seed)
    numel = math.prod(shape)
    rows = shape[0] if len(shape) >= 2 else numel
    cols = numel // max(rows, 1)
    low = torch.randn(rows, 3, generator=gen) @ torch.randn(3, cols, generator=gen)
    x = low + 0.1 * torch.randn(rows, cols, generator=gen)
    return x.reshape(shape).contiguous()


def decoded_steps(spec: str, shape: tuple[int, ...], device: torch.device) -> list[torch.Tensor]:
    """What one rank alone decodes on ``device`` over ``STEPS`` steps (fresh input each step,
    the same seed, state carried from step to step); returned on the CPU."""
    c = build_compressor(spec)
    size = torch.Size(shape)
    state = c.init_state(size, 1234, 0)
    out = []
    for step in range(STEPS):
        x = gradient(shape, seed=100 + step).to(device)
        payload = run_rounds_locally(c, x, state)
        assert payload.device.type == device.type, (spec, payload.device)
        if c.collective is Collective.ALL_REDUCE:
            estimate = c.decompress(payload, size, state)
        else:
            estimate = c.decompress_sum([payload], size, state)
        c.commit(payload, state)
        assert estimate.device.type == device.type and estimate.dtype == torch.float32
        assert estimate.shape == size
        out.append(estimate.cpu())
    return out


def assert_matches_cpu(
    spec: str, shape: tuple[int, ...], got: torch.Tensor, want: torch.Tensor
) -> None:
    """``got`` (decoded on the device) against ``want`` (the CPU's), at the spec's closeness."""
    kind = DETERMINISTIC[spec]
    if kind == EXACT:
        assert torch.equal(got, want), (spec, shape, (got - want).abs().max().item())
    else:
        scale = max(torch.linalg.vector_norm(want).item(), 1e-30)
        rel = torch.linalg.vector_norm(got - want).item() / scale
        assert rel < 1e-4, (spec, shape, rel)
        if spec.startswith("sign"):
            assert torch.equal(got.sign(), want.sign()), (spec, shape)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("spec", sorted(DETERMINISTIC))
def test_deterministic_compressor_matches_cpu(spec: str, shape: tuple[int, ...]) -> None:
    cpu = decoded_steps(spec, shape, torch.device("cpu"))
    cuda = decoded_steps(spec, shape, CUDA)
    for step, (got, want) in enumerate(zip(cuda, cpu, strict=True)):
        assert torch.isfinite(got).all(), (spec, shape, step)
        assert_matches_cpu(spec, shape, got, want)


def payload_contract(spec: str, device: torch.device) -> dict[str, Any]:
    """The contract of a random compressor's payloads on ``device`` (see the tests below)."""
    c = build_compressor(spec)
    shape = torch.Size([40, 30])
    x = gradient((40, 30), seed=7).to(device)
    state = c.init_state(shape, 99, 0)
    payload = c.compress(x, state)
    if c.collective is Collective.ALL_REDUCE:
        estimate = c.decompress(payload, shape, state)
    else:
        estimate = c.decompress_sum([payload], shape, state)
    replay = c.init_state(shape, 99, 0)
    other_rank = c.init_state(shape, 99, 1)
    other_payload = c.compress(x, other_rank)
    return {
        "collective": c.collective,
        "payload_device": payload.device.type,
        "payload_dtype": payload.dtype,
        "payload_bytes": payload.numel() * payload.element_size(),
        "wire_bytes": c.wire_bytes(shape, torch.float32),
        "estimate": (estimate.device.type, estimate.dtype, tuple(estimate.shape)),
        "replayed": torch.equal(c.compress(x, replay), payload),
        "other_rank_same": torch.equal(other_payload, payload),
        "untouched": torch.equal(x, gradient((40, 30), seed=7).to(device)),
    }


@pytest.mark.parametrize("spec", RANDOM_SPECS)
def test_random_compressor_contract_on_cuda(spec: str) -> None:
    out = payload_contract(spec, CUDA)
    assert out["payload_device"] == "cuda"
    assert out["payload_bytes"] == out["wire_bytes"]
    expected_dtype = torch.float32 if out["collective"] is Collective.ALL_REDUCE else torch.uint8
    assert out["payload_dtype"] == expected_dtype
    assert out["estimate"] == ("cuda", torch.float32, (40, 30))
    assert out["replayed"], "a state re-created from the same seed and rank must replay"
    assert out["untouched"], "compress must not modify its input"
    if spec.startswith("randomk"):
        assert out["other_rank_same"], "randomk ranks must select the same coordinates"
    else:
        assert not out["other_rank_same"], "qsgd ranks must draw independent noise"


def is_unbiased(spec: str, device: torch.device, trials: int = 3000) -> bool:
    """Whether the mean of ``trials`` decoded samples is within 5 SEM of the input."""
    c = build_compressor(spec)
    x = gradient((48,), seed=6).to(device)
    state = c.init_state(x.shape, 1234, 0)
    samples = torch.empty(trials, x.numel(), dtype=torch.float64, device=device)
    for t in range(trials):
        payload = c.compress(x, state)
        if c.collective is Collective.ALL_REDUCE:
            samples[t] = c.decompress(payload, x.shape, state).double()
        else:
            samples[t] = c.decompress_sum([payload], x.shape, state).double()
        c.commit(payload, state)
    mean = samples.mean(dim=0)
    sem = samples.std(dim=0) / math.sqrt(trials)
    floor = 1e-6 * x.abs().max().item()
    return bool(((mean - x.double()).abs() <= 5.0 * sem + floor).all())


@pytest.mark.parametrize("spec", RANDOM_SPECS)
def test_random_compressor_is_unbiased_on_cuda(spec: str) -> None:
    assert is_unbiased(spec, CUDA)


REPEATS = 200
REPEAT_CASES = [
    *[(spec, (64, 48)) for spec in sorted(DETERMINISTIC)],
    *[(spec, (64, 48)) for spec in RANDOM_SPECS],
    # the hierarchy test's ``fc3.bias``: 48 draws from 96 coordinates, with replacement, so
    # indices drawn three and four times are common
    ("randomk:ratio=0.5", (96,)),
    ("randomk:ratio=0.5", (1 << 16,)),
]


def distinct_decodes(spec: str, shape: tuple[int, ...], repeats: int = REPEATS) -> int:
    """How many different bit patterns ``repeats`` decodes of one received payload give on
    CUDA (the hook's ``decompress_into``, state untouched between them). What arrives is
    every rank's payload summed (all-reduce) or listed (all-gather, two ranks here)."""
    c = build_compressor(spec)
    size = torch.Size(shape)
    states = [c.init_state(size, 1234, rank) for rank in range(2)]
    payloads = [
        run_rounds_locally(c, gradient(shape, seed=200 + rank).to(CUDA), state)
        for rank, state in enumerate(states)
    ]
    received: Any = payloads if c.collective is Collective.ALL_GATHER else payloads[0] + payloads[1]
    seen = set()
    for _ in range(repeats):
        out = torch.empty(size.numel(), device=CUDA)
        c.decompress_into(received, out, size, states[0])
        seen.add(out.cpu().numpy().tobytes())
    return len(seen)


@pytest.mark.parametrize(("spec", "shape"), REPEAT_CASES, ids=str)
def test_decode_is_bitwise_repeatable_on_cuda(spec: str, shape: tuple[int, ...]) -> None:
    """Every owner of a layer decodes the same received payload, and the ranks must end
    bit-identical (the hierarchical hook's two nodes each decode it once): a decode whose
    rounding depends on thread timing, such as atomic adds of duplicate indices, breaks that.
    randomk decoded with ``index_add_`` until 2026-11-26: on one H200, 200 decodes of 32768
    draws from 65536 coordinates gave 200 different results, and 2000 of 2048 draws from 4096
    gave 43-164; ``index_put_(accumulate=True)`` gave one in every case."""
    assert distinct_decodes(spec, shape) == 1


EF_SPECS = ["fp16", "int8:chunk=16", "sign:chunk=16", "topk:ratio=0.1", "powersgd:rank=2"]


def _hook_state() -> types.SimpleNamespace:
    return types.SimpleNamespace(check_wire_bytes=True, profiler=None, step=0)


def ef_gap(spec: str, device: torch.device, steps: int = 12) -> tuple[float, float]:
    """Run the hook's encode path on ``device``: (max |sent + residual - sum of grads|, scale)."""
    compressor = build_compressor(spec)
    size = torch.Size([24, 20])
    slot = LayerSlot("layer.weight", size, torch.float32, 17, compressor)
    slot.state = compressor.init_state(size, slot.seed, 0)
    sent = torch.zeros(size, dtype=torch.float64, device=device)
    total = torch.zeros(size, dtype=torch.float64, device=device)
    for step in range(steps):
        grad = gradient((480,), seed=40 + step).to(device)  # a flat bucket slice
        payload, _ = encode_locally(slot, grad, _hook_state())
        target = torch.empty(size.numel(), device=device)
        received = [payload] if compressor.collective is Collective.ALL_GATHER else payload
        assert bool(decode_into(slot, received, target))
        sent += target.view(size).double()
        total += grad.view(size).double()
    assert slot.residual is not None and slot.residual.device.type == device.type
    gap = (sent + slot.residual.double() - total).abs().max().item()
    return gap, total.abs().max().item()


@pytest.mark.parametrize("spec", EF_SPECS)
def test_error_feedback_invariant_on_cuda(spec: str) -> None:
    gap, scale = ef_gap(spec, CUDA)
    assert gap <= 1e-5 * max(scale, 1.0), gap


def nonfinite_flags(spec: str, device: torch.device) -> list[bool]:
    """decode_into's finiteness flag for a finite gradient, then with a NaN and an Inf."""
    c = build_compressor(spec)
    size = torch.Size([12, 10])
    flags = []
    for poison in (None, math.nan, math.inf):
        slot = LayerSlot("w", size, torch.float32, 3, c, c.init_state(size, 3, 0))
        grad = gradient((120,), seed=60).to(device)
        if poison is not None:
            grad[7] = poison
        payload, _ = encode_locally(slot, grad, _hook_state())
        received = [payload] if c.collective is Collective.ALL_GATHER else payload
        flags.append(bool(decode_into(slot, received, torch.empty(120, device=device))))
    return flags


@pytest.mark.parametrize("spec", ["fp16", "int8", "sign", "topk:ratio=0.1", "powersgd:rank=2"])
def test_nonfinite_average_is_flagged_on_cuda(spec: str) -> None:
    assert nonfinite_flags(spec, CUDA) == [True, False, False]
