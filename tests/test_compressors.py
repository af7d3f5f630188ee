"""Tier 1: pure unit tests, no processes.

Covers the numerical contract of every built-in compressor (none, fp16, bf16, int8, qsgd,
sign, topk, randomk, powersgd):

- accuracy bounds of the casts and quantizers (fp16/bf16 relative error, int8 error within
  half a quantization step per chunk, sign decoding to the chunk's RMS, which keeps the
  chunk's norm);
- topk keeps exactly the k largest magnitudes and zeros the rest, also through its selection
  among the nonzeros of a large, mostly-zero tensor on the CPU;
- qsgd and randomk(unbiased=true) are unbiased in expectation (statistical check with a
  5-sigma tolerance), and biased compressors demonstrably fail that same check;
- powersgd recovers a rank-r matrix exactly from the first step (one power iteration on the
  current gradient), sends P then Q (two rounds) and 1-D / thin tensors uncompressed in one;
- payload size equals ``wire_bytes`` for every compressor and many shapes, payload dtypes
  match the collective, decompress restores the shape, and all-reduce payloads are summable;
- the error-feedback invariant (sum of sent estimates + final residual == sum of gradients)
  through the real hook code path (``autocomp.hook_layer.encode_locally``), and its failure
  without EF;
- compressors are stateless configs: one instance serves several layers without interference;
- the work shares the exposure model places by round are well formed.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from autocomp.compressors import (
    Collective,
    build_compressor,
    effective_compressor,
    run_rounds_locally,
)
from autocomp.compressors.sparse import largest_indices
from autocomp.hook_layer import LayerSlot, decode_into, encode_locally

ALL_NAMES = ["none", "fp16", "bf16", "int8", "qsgd", "sign", "topk", "randomk", "powersgd"]

# Defaults plus variants that exercise other code paths (sub-byte codes, odd chunks, ranks).
SPECS = [
    *ALL_NAMES,
    "fp16:ef=false",
    "int8:chunk=3",
    "qsgd:levels=1,chunk=4",
    "qsgd:levels=5,chunk=7",
    "qsgd:levels=127,chunk=5",
    "sign:chunk=5",
    "topk:ratio=0.3",
    "topk:ratio=1.0",
    "randomk:ratio=0.3,unbiased=false",
    "randomk:ratio=0.5",
    "powersgd:rank=1",
    "powersgd:rank=2,ef=false",
]

# 0-d, length 1, odd 1-d, 2-D, 4-D conv-shaped, thin conv, wide matrix.
SHAPES = [(), (1,), (7,), (13,), (6, 5), (4, 3, 3, 3), (8, 1, 1, 1), (3, 17)]


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=_gen(seed))


def _nbytes(payload: torch.Tensor) -> int:
    return payload.numel() * payload.element_size()


def _roundtrip(spec: str, x: torch.Tensor, seed: int = 7) -> torch.Tensor:
    c = build_compressor(spec)
    state = c.init_state(x.shape, seed, 0)
    return c.decompress(run_rounds_locally(c, x, state), x.shape, state)


# ---- casts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "bound"), [("fp16", 1e-3), ("bf16", 1e-2)])
def test_cast_relative_error(spec: str, bound: float) -> None:
    x = _randn(4096, seed=1)
    y = _roundtrip(spec, x)
    assert y.dtype == torch.float32
    rel = (torch.linalg.vector_norm(y - x) / torch.linalg.vector_norm(x)).item()
    assert rel < bound
    # Per element too, for values in the normal range of the 16-bit type.
    normal = x.abs() > 1e-3
    per_elem = ((y - x).abs() / x.abs())[normal]
    assert per_elem.max().item() < bound


def test_fp16_is_more_precise_than_bf16() -> None:
    x = _randn(4096, seed=2)
    err16 = (_roundtrip("fp16", x) - x).norm()
    errbf = (_roundtrip("bf16", x) - x).norm()
    assert err16 < errbf / 4  # 10 vs 7 mantissa bits: 8x in theory


def test_fp16_saturates_instead_of_overflowing() -> None:
    x = torch.tensor([1e6, -1e6, 1.0, 70000.0])
    y = _roundtrip("fp16", x)
    limit = torch.finfo(torch.float16).max
    assert torch.isfinite(y).all()
    assert y.tolist() == [limit, -limit, 1.0, limit]


@pytest.mark.parametrize("spec", ["fp16:ef=false", "bf16:ef=false"])
def test_a_finite_cast_payload_is_the_plain_cast_bit_for_bit(spec: str) -> None:
    """The non-finite marker on the first element must leave a finite layer's bits alone
    (a -0 there included): the hook's cast spans send the plain cast of many layers at once
    and must match this payload exactly."""
    c = build_compressor(spec)
    x = torch.tensor([-0.0, -1e-9, 2.5, -0.0, 1e6])
    payload = c.compress(x, c.init_state(x.shape, 0, 0))
    limit = torch.finfo(payload.dtype).max
    plain = x.to(payload.dtype).clamp(-limit, limit)
    assert torch.equal(payload.view(torch.int16), plain.view(torch.int16))
    assert math.copysign(1.0, payload[0].item()) == -1.0


def test_none_is_exact() -> None:
    x = _randn(5, 7, seed=3)
    assert torch.equal(_roundtrip("none", x), x)


# ---- quantizers ----------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 7, 64, 256, 5000])
@pytest.mark.parametrize("numel", [1, 130, 1001])
def test_int8_error_within_half_step_per_chunk(chunk: int, numel: int) -> None:
    x = _randn(numel, seed=chunk + numel) * 3.0
    y = _roundtrip(f"int8:chunk={chunk}", x)
    for start in range(0, numel, chunk):
        xs, ys = x[start : start + chunk], y[start : start + chunk]
        scale = xs.abs().max().item() / 127.0
        err = (ys - xs).abs().max().item()
        assert err <= scale * (0.5 + 1e-4), (start, err, scale)
        # Decoded values sit on the chunk's grid of integer multiples of the scale.
        codes = ys / scale
        assert torch.allclose(codes, codes.round(), atol=1e-3)
        assert codes.abs().max().item() <= 127 + 1e-3


def test_int8_zero_chunk_decodes_to_zero() -> None:
    x = torch.zeros(10)
    x[5:] = _randn(5, seed=4)
    y = _roundtrip("int8:chunk=5", x)
    assert torch.equal(y[:5], torch.zeros(5))


@pytest.mark.parametrize(("chunk", "numel"), [(1024, 1), (1024, 777), (8, 100), (5, 5), (3, 10)])
def test_sign_decodes_to_chunk_rms(chunk: int, numel: int) -> None:
    """Norm-preserving scale: each decoded chunk has exactly its input's norm."""
    x = _randn(numel, seed=numel) * 2.0
    y = _roundtrip(f"sign:chunk={chunk}", x)
    for start in range(0, numel, chunk):
        xs, ys = x[start : start + chunk], y[start : start + chunk]
        rms = xs.square().mean().sqrt()  # over the chunk's real elements, padding excluded
        expected = torch.where(xs >= 0, rms, -rms)
        assert torch.allclose(ys, expected, rtol=1e-5, atol=0), start
        assert torch.allclose(ys.norm(), xs.norm(), rtol=1e-5)


# ---- sparsifiers ---------------------------------------------------------------------------


def _distinct_magnitudes(numel: int, seed: int) -> torch.Tensor:
    g = _gen(seed)
    magnitudes = (torch.randperm(numel, generator=g) + 1).float() * 0.01
    signs = torch.randint(0, 2, (numel,), generator=g).float() * 2 - 1
    return magnitudes * signs


@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.1, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("shape", [(1,), (9,), (101,), (10, 30), (3, 4, 5, 2)])
def test_topk_keeps_exactly_the_k_largest(ratio: float, shape: tuple[int, ...]) -> None:
    numel = math.prod(shape)
    x = _distinct_magnitudes(numel, seed=numel).reshape(shape)
    y = _roundtrip(f"topk:ratio={ratio}", x)
    assert y.shape == x.shape
    k = max(1, round(ratio * numel))
    expected = set(torch.topk(x.abs().reshape(-1), k).indices.tolist())
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    kept = set(torch.nonzero(flat_y).reshape(-1).tolist())
    assert kept == expected
    idx = torch.tensor(sorted(expected), dtype=torch.long)
    assert torch.equal(flat_y[idx], flat_x[idx])  # kept values are sent exactly
    mask = torch.ones(numel, dtype=torch.bool)
    mask[idx] = False
    assert torch.equal(flat_y[mask], torch.zeros(int(mask.sum())))


def test_randomk_shared_seed_selects_same_coordinates_on_every_rank() -> None:
    c = build_compressor("randomk:ratio=0.2,unbiased=false")
    shape = torch.Size([50])
    s0, s1 = c.init_state(shape, 11, 0), c.init_state(shape, 11, 1)
    x = _randn(50, seed=5) + 10.0  # no zeros, so nonzero pattern == selected set
    y0 = c.decompress(c.compress(x, s0), shape, s0)
    y1 = c.decompress(c.compress(x, s1), shape, s1)
    assert torch.equal(y0, y1)
    # ...and commit advances to a different selection.
    c.commit(torch.empty(0), s0)
    y2 = c.decompress(c.compress(x, s0), shape, s0)
    assert not torch.equal(y0.nonzero(), y2.nonzero())


# ---- unbiasedness --------------------------------------------------------------------------


def _is_unbiased(spec: str, x: torch.Tensor, trials: int, sigmas: float = 5.0) -> bool:
    """Whether the mean of ``trials`` decompressed samples is within ``sigmas`` SEM of x."""
    c = build_compressor(spec)
    state = c.init_state(x.shape, 1234, 0)
    samples = torch.empty(trials, x.numel(), dtype=torch.float64)
    for t in range(trials):
        payload = c.compress(x, state)
        samples[t] = c.decompress(payload, x.shape, state).reshape(-1).double()
        c.commit(payload, state)  # advances randomk's draw; qsgd advances its generator
    mean = samples.mean(dim=0)
    sem = samples.std(dim=0) / math.sqrt(trials)
    floor = 1e-6 * x.abs().max().item()  # float32 rounding of exact (zero-variance) entries
    deviation = (mean - x.reshape(-1).double()).abs()
    return bool((deviation <= sigmas * sem + floor).all())


UNBIASED_SPECS = [
    "qsgd",
    "qsgd:levels=1,chunk=16",
    "qsgd:levels=5,chunk=7",
    "randomk:ratio=0.25",
    "randomk:ratio=0.05",
]
BIASED_SPECS = ["sign:chunk=16", "topk:ratio=0.25", "randomk:ratio=0.25,unbiased=false"]


@pytest.mark.parametrize("spec", UNBIASED_SPECS)
def test_unbiased_in_expectation(spec: str) -> None:
    x = _randn(48, seed=6)
    assert not build_compressor(spec).biased
    assert _is_unbiased(spec, x, trials=3000)


@pytest.mark.parametrize("spec", BIASED_SPECS)
def test_biased_compressors_fail_the_unbiasedness_check(spec: str) -> None:
    x = _randn(48, seed=6)
    assert build_compressor(spec).biased
    assert not _is_unbiased(spec, x, trials=3000)


def test_qsgd_ranks_draw_independent_noise() -> None:
    c = build_compressor("qsgd:levels=1,chunk=8")
    shape = torch.Size([64])
    x = _randn(64, seed=8)
    s0, s1 = c.init_state(shape, 3, 0), c.init_state(shape, 3, 1)
    assert not torch.equal(c.compress(x, s0), c.compress(x, s1))
    # ...but a state re-created from the same seed and rank replays the same draws.
    s0b = c.init_state(shape, 3, 0)
    s0c = c.init_state(shape, 3, 0)
    assert torch.equal(c.compress(x, s0b), c.compress(x, s0c))


# ---- powersgd ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "rank"), [((40, 30), 3), ((30, 40), 3), ((8, 4, 3, 3), 2), ((25, 25), 1)]
)
def test_powersgd_recovers_low_rank_matrix_from_the_first_step(
    shape: tuple[int, ...], rank: int
) -> None:
    """One power iteration on the current gradient: P = M Q spans M's column space when M has
    rank r, so the projection is exact at once (the previous one-factor-per-step design
    projected onto the last step's subspace and was never exact on the first step)."""
    rows = shape[0]
    cols = math.prod(shape[1:])
    m = (_randn(rows, rank, seed=9) @ _randn(rank, cols, seed=10)).reshape(shape)
    c = build_compressor(f"powersgd:rank={rank},ef=false")
    assert c.rounds_for(m.shape) == 2
    assert c.round_wire_bytes(m.shape, torch.float32) == (rows * rank * 4, cols * rank * 4)
    assert c.wire_bytes(m.shape, torch.float32) == (rows + cols) * rank * 4
    state = c.init_state(m.shape, 5, 0)
    for step in range(4):
        p = c.compress(m, state)
        assert _nbytes(p) == rows * rank * 4
        q = c.compress_round(m, 1, p, state)
        assert _nbytes(q) == cols * rank * 4
        estimate = c.decompress(q, m.shape, state)
        c.commit(q, state)
        assert estimate.shape == m.shape
        tol = 1e-4 * m.abs().max().item()
        assert torch.allclose(estimate, m, rtol=1e-4, atol=tol), step


def test_powersgd_warm_start_converges_to_the_top_subspace() -> None:
    """On a full-rank matrix with a decaying spectrum, the warm-started iteration gets closer
    to the best rank-r approximation step after step (power iteration across steps)."""
    u, _ = torch.linalg.qr(_randn(64, 64, seed=1))
    v, _ = torch.linalg.qr(_randn(48, 48, seed=2))
    spectrum = torch.tensor([0.7**i for i in range(48)])
    m = u[:, :48] @ torch.diag(spectrum) @ v.T
    best = torch.linalg.vector_norm(spectrum[2:]).item()  # Eckart-Young at rank 2
    c = build_compressor("powersgd:rank=2,ef=false")
    state = c.init_state(m.shape, 3, 0)
    errors = []
    for _ in range(8):
        q = run_rounds_locally(c, m, state)
        errors.append(torch.linalg.vector_norm(c.decompress(q, m.shape, state) - m).item())
        c.commit(q, state)
    assert errors[-1] < errors[0]
    assert errors[-1] == pytest.approx(best, rel=0.05)


@pytest.mark.parametrize(
    ("shape", "rank"),
    [((17,), 1), ((), 1), ((1,), 4), ((5, 3), 3), ((5, 3), 4), ((4, 4), 4), ((8, 1, 1, 1), 1)],
)
def test_powersgd_sends_1d_and_thin_tensors_uncompressed(shape: tuple[int, ...], rank: int) -> None:
    x = torch.randn(shape, generator=_gen(12))
    c = build_compressor(f"powersgd:rank={rank}")
    assert c.rounds_for(x.shape) == 1
    state = c.init_state(x.shape, 5, 0)
    for _ in range(2):
        payload = c.compress(x, state)
        assert _nbytes(payload) == x.numel() * 4 == c.wire_bytes(x.shape, torch.float32)
        assert torch.equal(c.decompress(payload, x.shape, state), x)
        c.commit(payload, state)


def test_effective_compressor_is_none_where_the_compressor_would_send_whole() -> None:
    """What the hook runs: PowerSGD on a 1-D tensor or a matrix no wider than its rank is
    'none'; on a matrix it compresses, and every other compressor anywhere, unchanged."""
    none = build_compressor("none")
    psgd = build_compressor("powersgd:rank=4")
    for shape in [(17,), (), (4, 4), (9, 3), (8, 1, 1, 1)]:
        assert psgd.sends_as_is(torch.Size(shape))
        assert effective_compressor(psgd, torch.Size(shape)) == none
    assert effective_compressor(psgd, torch.Size([5, 5])) is psgd
    assert none.sends_as_is(torch.Size([3, 3]))
    assert effective_compressor(none, torch.Size([3])) is none
    for spec in SPECS:
        c = build_compressor(spec)
        if c.name in ("powersgd", "none"):
            continue
        for shape in SHAPES:
            assert not c.sends_as_is(torch.Size(shape)), (spec, shape)
            assert effective_compressor(c, torch.Size(shape)) is c


def test_powersgd_shared_instance_keeps_layers_independent() -> None:
    shared = build_compressor("powersgd:rank=2")
    layers = {
        "a": (_randn(12, 9, seed=13), 101),
        "b": (_randn(7, 2, 3, seed=14), 202),
        "c": (_randn(12, 9, seed=15), 303),  # same shape as "a", different data and seed
    }

    def run(compressor, name, state):  # one step for one layer
        x, _ = layers[name]
        payload = run_rounds_locally(compressor, x, state)
        estimate = compressor.decompress(payload, x.shape, state)
        compressor.commit(payload, state)
        return estimate

    # Interleaved: every layer steps through the one shared instance in turn.
    states = {n: shared.init_state(x.shape, seed, 0) for n, (x, seed) in layers.items()}
    interleaved = {n: [] for n in layers}
    for _ in range(4):
        for name in layers:
            interleaved[name].append(run(shared, name, states[name]))

    # Alone: each layer with its own fresh instance, no other layer in between.
    for name, (x, seed) in layers.items():
        own = build_compressor("powersgd:rank=2")
        state = own.init_state(x.shape, seed, 0)
        alone = [run(own, name, state) for _ in range(4)]
        for a, b in zip(alone, interleaved[name], strict=True):
            assert torch.equal(a, b), name
    assert shared.config == {"rank": 2, "ef": True}  # the config itself never changed


# ---- wire bytes, dtypes, shapes ------------------------------------------------------------


def _check_payload_contract(spec: str, shape: tuple[int, ...]) -> None:
    c = build_compressor(spec)
    size = torch.Size(shape)
    state = c.init_state(size, 21, 0)
    rounds = c.rounds_for(size)
    expected = c.round_wire_bytes(size, torch.float32)
    assert len(expected) == rounds
    assert sum(expected) == c.wire_bytes(size, torch.float32)
    for step in range(3):  # several steps: warm starts and counters advance
        x = torch.randn(size, generator=_gen(step))
        before = x.clone()
        payload = c.compress(x, state)
        assert _nbytes(payload) == expected[0]
        for index in range(1, rounds):
            payload = c.compress_round(x, index, payload, state)
            assert _nbytes(payload) == expected[index]
        assert torch.equal(x, before), "compress modified its input"
        if x.numel() and c.error_feedback:
            # Error feedback subtracts the estimate from x in place before the payload is sent.
            assert payload.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        assert payload.dim() == 1
        if c.collective is Collective.ALL_GATHER:
            assert payload.dtype == torch.uint8
        else:
            assert payload.dtype == c.payload_dtype(torch.float32)
        y = c.decompress(payload, size, state)
        assert y.shape == size
        assert y.dtype == torch.float32
        assert torch.isfinite(y).all()
        c.commit(payload, state)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("spec", SPECS)
def test_payload_matches_wire_bytes_and_shape(spec: str, shape: tuple[int, ...]) -> None:
    _check_payload_contract(spec, shape)


@pytest.mark.parametrize("shape", [(0,), (3, 0)], ids=str)
@pytest.mark.parametrize(
    "spec",
    ALL_NAMES,
)
def test_zero_element_tensors(spec: str, shape: tuple[int, ...]) -> None:
    _check_payload_contract(spec, shape)


def test_wire_bytes_formulas() -> None:
    shape = torch.Size([10, 100])  # 1000 elements
    f32 = torch.float32
    assert build_compressor("none").wire_bytes(shape, f32) == 4000
    assert build_compressor("none").wire_bytes(shape, torch.float16) == 2000
    assert build_compressor("fp16").wire_bytes(shape, f32) == 2000
    assert build_compressor("bf16").wire_bytes(shape, f32) == 2000
    assert build_compressor("int8:chunk=256").wire_bytes(shape, f32) == 1000 + 4 * 4
    assert build_compressor("sign:chunk=1024").wire_bytes(shape, f32) == 125 + 4
    assert build_compressor("sign").wire_bytes(shape, f32) == 125 + 4 * 4  # chunk 256
    assert build_compressor("qsgd:levels=1,chunk=512").wire_bytes(shape, f32) == 250 + 8
    assert build_compressor("qsgd:levels=7,chunk=512").wire_bytes(shape, f32) == 500 + 8
    assert build_compressor("qsgd:levels=8,chunk=512").wire_bytes(shape, f32) == 1000 + 8
    assert build_compressor("topk:ratio=0.01").wire_bytes(shape, f32) == 10 * 8
    assert build_compressor("randomk:ratio=0.01").wire_bytes(shape, f32) == 10 * 4


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("spec", SPECS)
def test_work_shares_place_the_work_by_round(spec: str, shape: tuple[int, ...]) -> None:
    """What the exposure model needs to place the work: shares of it between the rounds (only
    with two) and after the last collective, leaving the encode its part."""
    compressor = build_compressor(spec)
    size = torch.Size(shape)
    final, decode = compressor.work_shares(size)
    assert 0.0 <= final < 1.0 and 0.0 <= decode < 1.0 and final + decode < 1.0
    assert (final > 0) == (compressor.rounds_for(size) > 1)


def _storages(value: object) -> set[int]:
    """Addresses of the storages of every tensor in ``value`` (nested dicts, lists, tuples)."""
    if isinstance(value, torch.Tensor):
        return {value.untyped_storage().data_ptr()} if value.numel() else set()
    if isinstance(value, dict):
        return set().union(*(_storages(v) for v in value.values()))
    if isinstance(value, (list, tuple)):
        return set().union(*(_storages(v) for v in value))
    return set()


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.startswith("none")])
def test_every_round_payload_is_a_tensor_of_its_own(spec: str) -> None:
    """The hook sums an all-reduce payload in place, without a copy when it is alone in its
    collective: a payload sharing memory with the gradient it encodes or with the compressor
    state would be overwritten by the ranks' sum (``Compressor.compress``'s contract)."""
    c = build_compressor(spec)
    for shape in (torch.Size([12, 10]), torch.Size([30])):
        x = _randn(*shape, seed=41)
        state = c.init_state(shape, 7, 0)
        payload = c.compress(x, state)
        for index in range(1, c.rounds_for(shape)):
            assert payload.untyped_storage().data_ptr() not in _storages(x) | _storages(state)
            payload = c.compress_round(x, index, payload.clone(), state)
        owned = _storages(x) | _storages(state)
        assert payload.untyped_storage().data_ptr() not in owned, (spec, tuple(shape))


@pytest.mark.parametrize("spec", SPECS)
def test_payloads_combine_across_ranks(spec: str) -> None:
    """All-reduce payloads are summable; all-gather payloads decode to the sum of ranks."""
    c = build_compressor(spec)
    shape = torch.Size([12, 10])
    xs = [_randn(12, 10, seed=30 + r) for r in range(3)]
    states = [c.init_state(shape, 99, r) for r in range(3)]
    payloads = [c.compress(x, s) for x, s in zip(xs, states, strict=True)]
    for index in range(1, c.rounds_for(shape)):  # later rounds see the previous round's sum
        summed = payloads[0] + payloads[1] + payloads[2]
        payloads = [c.compress_round(x, index, summed, s) for x, s in zip(xs, states, strict=True)]
    separate = sum(c.decompress(p, shape, s) for p, s in zip(payloads, states, strict=True))
    if c.collective is Collective.ALL_REDUCE:
        summed = payloads[0] + payloads[1] + payloads[2]
        combined = c.decompress(summed, shape, states[0])
        # 16-bit wire types round the sum itself.
        tol = 2e-2 if summed.dtype in (torch.float16, torch.bfloat16) else 1e-5
    else:
        combined = c.decompress_sum(payloads, shape, states[0])
        tol = 1e-6
    assert torch.allclose(combined, separate, rtol=tol, atol=tol)


# ---- error feedback through the hook's code path ---------------------------------------------

EF_SPECS = [
    "fp16",
    "bf16",
    "int8:chunk=16",
    "sign:chunk=16",
    "topk:ratio=0.1",
    "powersgd:rank=2",
    "randomk:ratio=0.1,unbiased=false",
]


def _hook_state() -> types.SimpleNamespace:
    """The attributes of HookState the encoding reads, for a single rank without profiling."""
    return types.SimpleNamespace(check_wire_bytes=True, profiler=None, step=0)


def _ef_gap(spec: str, shape: tuple[int, ...], steps: int = 20) -> tuple[float, float]:
    """Run ``steps`` steps through ``encode_locally``; return (max |invariant gap|, scale)."""
    compressor = build_compressor(spec)
    size = torch.Size(shape)
    slot = LayerSlot("layer.weight", size, torch.float32, 17, compressor)
    slot.state = compressor.init_state(size, slot.seed, 0)
    hook_state = _hook_state()
    sent = torch.zeros(size, dtype=torch.float64)
    total = torch.zeros(size, dtype=torch.float64)
    g = _gen(40)
    for _ in range(steps):
        grad = torch.randn(size.numel(), generator=g)  # a flat bucket slice, as in the hook
        payload, _ = encode_locally(slot, grad, hook_state)
        # Single rank: the "summed" payload is this rank's own payload.
        if compressor.collective is Collective.ALL_REDUCE:
            estimate = compressor.decompress(payload, size, slot.state)
        else:
            estimate = compressor.decompress_sum([payload], size, slot.state)
        compressor.commit(payload, slot.state)
        sent += estimate.double()
        total += grad.view(size).double()
    residual = torch.zeros(size) if slot.residual is None else slot.residual
    gap = (sent + residual.double() - total).abs().max().item()
    return gap, total.abs().max().item()


@pytest.mark.parametrize("shape", [(12, 10), (6, 3, 2, 2)], ids=str)
@pytest.mark.parametrize("spec", EF_SPECS)
def test_error_feedback_invariant(spec: str, shape: tuple[int, ...]) -> None:
    assert build_compressor(spec).error_feedback
    gap, scale = _ef_gap(spec, shape)
    assert gap <= 1e-5 * max(scale, 1.0), gap


@pytest.mark.parametrize("spec", ["topk:ratio=0.1,ef=false", "sign:chunk=16,ef=false"])
def test_error_feedback_invariant_breaks_without_ef(spec: str) -> None:
    assert not build_compressor(spec).error_feedback
    gap, scale = _ef_gap(spec, (12, 10))
    assert gap > 0.1 * scale


def test_encode_keeps_residual_only_for_ef_compressors() -> None:
    hook_state = _hook_state()
    for spec, keeps in [("topk:ratio=0.1", True), ("qsgd", False), ("randomk", False)]:
        c = build_compressor(spec)
        size = torch.Size([20])
        slot = LayerSlot("w", size, torch.float32, 1, c, c.init_state(size, 1, 0))
        encode_locally(slot, _randn(20, seed=41), hook_state)
        assert (slot.residual is not None) == keeps, spec


@pytest.mark.parametrize("spec", SPECS)
def test_encode_leaves_the_gradient_untouched(spec: str) -> None:
    """Without error feedback the hook compresses the bucket slice itself (no private copy),
    so ``compress`` must not write to its input; with it, the residual is a separate buffer."""
    c = build_compressor(spec)
    size = torch.Size([24, 10])
    slot = LayerSlot("w", size, torch.float32, 1, c, c.init_state(size, 1, 0))
    for step in range(3):  # a residual exists from step 1 on
        grad = _randn(240, seed=60 + step)
        before = grad.clone()
        encode_locally(slot, grad, _hook_state())
        assert torch.equal(grad, before), (spec, step)
        assert slot.residual is None or slot.residual.data_ptr() != grad.data_ptr()


def test_encode_flushes_pending_residual_into_none() -> None:
    """A layer switched to ``none`` sends gradient + residual once, then drops the residual."""
    c = build_compressor("none")
    size = torch.Size([6])
    residual = _randn(6, seed=42)
    slot = LayerSlot("w", size, torch.float32, 1, c, {}, residual=residual.clone())
    grad = _randn(6, seed=43)
    payload, _ = encode_locally(slot, grad, _hook_state())
    assert torch.allclose(c.decompress(payload, size, slot.state), grad + residual)
    assert slot.residual is None


def test_encode_flushes_pending_residual_into_none_fp16_grads() -> None:
    c = build_compressor("none")
    size = torch.Size([6])
    slot = LayerSlot("w", size, torch.float16, 1, c, {}, residual=torch.full((6,), 0.25))
    grad = torch.ones(6, dtype=torch.float16)
    payload, _ = encode_locally(slot, grad, _hook_state())
    assert payload.dtype == c.payload_dtype(torch.float16)
    assert torch.allclose(c.decompress(payload, size, slot.state).float(), torch.full((6,), 1.25))


# ---- robustness ----------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["int8", "sign", "topk", "fp16", "bf16", "powersgd:rank=1"])
def test_one_large_finite_entry_keeps_output_finite(spec: str) -> None:
    x = _randn(6, 8, seed=50)
    x[2, 3] = 1e20  # finite, but its square overflows float32
    y = _roundtrip(spec, x)
    assert torch.isfinite(y).all()


def test_qsgd_one_large_finite_entry_keeps_output_finite() -> None:
    x = _randn(6, 8, seed=50)
    x[2, 3] = 1e20
    y = _roundtrip("qsgd", x)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("spec", ["fp16", "topk:ratio=0.1", "powersgd:rank=2", "int8", "sign"])
def test_decode_into_flags_a_non_finite_average(spec: str, bad: float) -> None:
    """The hook's finiteness flag (a float32 sum) sees NaN and +-Inf in a rank's gradient
    through any compressor, and stays True for a finite gradient with one huge entry."""
    c = build_compressor(spec)
    size = torch.Size([12, 10])
    for poison, expected in ((None, True), (bad, False), (1e30, True)):
        slot = LayerSlot("w", size, torch.float32, 3, c, c.init_state(size, 3, 0))
        grad = _randn(120, seed=60)
        if poison is not None:
            grad[7] = poison
        payload, _ = encode_locally(slot, grad, _hook_state())
        received = [payload] if c.collective is Collective.ALL_GATHER else payload
        target = torch.empty(120)
        assert bool(decode_into(slot, received, target)) is expected, (spec, poison)


@pytest.mark.parametrize("nonzero", [0, 300, 5_000, 40_000, 200_000])
def test_top_k_of_a_mostly_zero_tensor_selects_as_torch_topk(nonzero: int) -> None:
    """On the CPU, top-k of a large, mostly-zero tensor (an embedding table's gradient)
    selects among its nonzeros (``largest_indices``): the same magnitudes as ``torch.topk``,
    each index once, every nonzero kept when there are no more than k, and the decoded
    tensor bit for bit what ``torch.topk``'s selection decodes to."""
    numel, k = 131_072 * 2, 2_621
    gen = torch.Generator().manual_seed(nonzero)
    flat = torch.zeros(numel)
    where = torch.randperm(numel, generator=gen)[:nonzero]
    flat[where] = torch.randn(nonzero, generator=gen)
    chosen = largest_indices(flat, k)
    reference = torch.topk(flat.abs(), k, sorted=False).indices
    assert chosen.numel() == k and chosen.unique().numel() == k
    assert torch.equal(flat.abs()[chosen].sort().values, flat.abs()[reference].sort().values)
    if nonzero <= k:
        assert set(where.tolist()) <= set(chosen.tolist())
    compressor = build_compressor("topk:ratio=0.01")
    shape = torch.Size((512, 512))
    decoded = compressor.decompress(compressor.compress(flat.view(shape), {}), shape, {})
    expected = torch.zeros(numel)
    expected[reference] = flat[reference]
    # Random normal values leave no tie at the k-th magnitude: one top-k set, one result.
    assert torch.equal(decoded.reshape(-1), expected)
    # A ratio near 1: k + the nonzeros exceed the tensor, and the padding still fits.
    most = largest_indices(flat, numel - 10)
    assert most.numel() == numel - 10 and most.unique().numel() == numel - 10
    assert set(where.tolist()) <= set(most.tolist())
