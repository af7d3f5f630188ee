"""Tier 1: pure unit tests, no processes.

Covers compressor spec strings and the registry: canonical specs and their round trip,
lenient spelling (spaces, upper-case names, bool words), the ValueError/TypeError raised for
every kind of bad spec (and that its message names what is valid), hypothesis property tests
over random valid parameters, random shapes and non-contiguous inputs (wire bytes, shapes,
finiteness, input left untouched), and ``register_compressor`` for user compressors.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autocomp.compressors import (
    Collective,
    Compressor,
    Param,
    available_compressors,
    build_compressor,
    parse_spec,
    register_compressor,
)
from autocomp.compressors import base as compressor_base

BUILTIN = ["none", "fp16", "bf16", "int8", "qsgd", "sign", "topk", "randomk", "powersgd"]

CANONICAL_DEFAULTS = {
    "none": "none",
    "fp16": "fp16:ef=true",
    "bf16": "bf16:ef=true",
    "int8": "int8:chunk=256,ef=true",
    "qsgd": "qsgd:levels=16,chunk=512",
    "sign": "sign:chunk=256,ef=true",
    "topk": "topk:ratio=0.01,ef=true",
    "randomk": "randomk:ratio=0.01,unbiased=true",
    "powersgd": "powersgd:rank=4,ef=true",
}


# ---- canonical specs -----------------------------------------------------------------------


def test_builtins_are_registered() -> None:
    assert set(BUILTIN) <= set(available_compressors())


@pytest.mark.parametrize(("name", "canonical"), CANONICAL_DEFAULTS.items())
def test_defaults_are_spelled_out(name: str, canonical: str) -> None:
    c = build_compressor(name)
    assert c.spec == canonical
    assert build_compressor(canonical).spec == canonical
    assert c.config == {p.name: p.default for p in type(c).params}


@pytest.mark.parametrize(
    "spec",
    [
        "topk:ratio=0.25,ef=false",
        "randomk:ratio=0.5,unbiased=false",
        "powersgd:rank=1,ef=false",
        "qsgd:levels=1,chunk=3",
        "int8:chunk=1,ef=false",
        "sign:chunk=16777216,ef=true",
        "fp16:ef=false",
    ],
)
def test_canonical_spec_round_trips(spec: str) -> None:
    c = build_compressor(spec)
    assert c.spec == spec
    again = build_compressor(c.spec)
    assert again.spec == c.spec
    assert again == c
    assert hash(again) == hash(c)
    assert again.config == c.config


@pytest.mark.parametrize(
    ("spec", "canonical"),
    [
        ("topk:ef=false,ratio=0.1", "topk:ratio=0.1,ef=false"),  # canonical parameter order
        ("topk:ratio=0.10", "topk:ratio=0.1"),
        ("topk:ratio=1", "topk:ratio=1.0,ef=true"),
        ("powersgd:rank=2", "powersgd:rank=2,ef=true"),
        ("  TopK : ratio = 0.1 , ef = FALSE  ", "topk:ratio=0.1,ef=false"),
        ("POWERSGD:rank=8", "powersgd:rank=8,ef=true"),
        ("NONE", "none"),
        ("None:", "none"),
        ("fp16:ef=no", "fp16:ef=false"),
        ("fp16:ef=0", "fp16:ef=false"),
        ("fp16:ef=Yes", "fp16:ef=true"),
        ("bf16:ef=1", "bf16:ef=true"),
        ("int8: chunk = 64 ", "int8:chunk=64,ef=true"),
    ],
)
def test_lenient_spellings_normalise(spec: str, canonical: str) -> None:
    c = build_compressor(spec)
    expected = build_compressor(canonical)
    assert c.spec == expected.spec
    assert c == expected


def test_equal_specs_mean_equal_compressors() -> None:
    assert build_compressor("topk:ratio=0.1") == build_compressor("topk:ef=true,ratio=0.10")
    assert build_compressor("topk:ratio=0.1") != build_compressor("topk:ratio=0.2")
    assert build_compressor("fp16") != build_compressor("bf16")
    assert len({build_compressor("int8"), build_compressor("int8:chunk=256")}) == 1


def test_build_passes_compressor_instances_through() -> None:
    c = build_compressor("sign")
    assert build_compressor(c) is c


def test_parse_spec_splits_name_and_params() -> None:
    assert parse_spec("topk:ratio=0.01,ef=true") == ("topk", {"ratio": "0.01", "ef": "true"})
    assert parse_spec(" FP16 ") == ("fp16", {})


def test_constructor_keywords_match_spec() -> None:
    cls = available_compressors()["topk"]
    assert cls(ratio=0.5, ef=False).spec == "topk:ratio=0.5,ef=false"
    with pytest.raises(ValueError, match="ratio"):
        cls(ratio=2.0)


# ---- bad specs -----------------------------------------------------------------------------


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown compressor") as info:
        build_compressor("topkk:ratio=0.1")
    message = str(info.value)
    assert "topkk" in message
    for name in BUILTIN:
        assert name in message


@pytest.mark.parametrize(
    ("spec", "params"),
    [
        ("topk:rank=3", ["ratio", "ef"]),
        ("powersgd:ratio=0.1", ["rank", "ef"]),
        ("qsgd:ef=true", ["levels", "chunk"]),
        ("int8:RATIO=0.1", ["chunk", "ef"]),
    ],
)
def test_unknown_parameter_lists_valid_params(spec: str, params: list[str]) -> None:
    with pytest.raises(ValueError, match="has no parameter") as info:
        build_compressor(spec)
    message = str(info.value)
    for p in params:
        assert p in message


def test_parameter_for_parameterless_compressor() -> None:
    with pytest.raises(ValueError, match="takes no parameters"):
        build_compressor("none:ef=true")


@pytest.mark.parametrize(
    ("spec", "param"),
    [
        ("topk:ratio=0", "ratio"),
        ("topk:ratio=0.0", "ratio"),
        ("topk:ratio=-0.1", "ratio"),
        ("topk:ratio=1.5", "ratio"),
        ("randomk:ratio=1.5", "ratio"),
        ("powersgd:rank=0", "rank"),
        ("powersgd:rank=1025", "rank"),
        ("qsgd:levels=200", "levels"),
        ("qsgd:levels=0", "levels"),
        ("int8:chunk=0", "chunk"),
        ("sign:chunk=0", "chunk"),
        ("qsgd:chunk=-5", "chunk"),
    ],
)
def test_out_of_range_values_name_the_valid_range(spec: str, param: str) -> None:
    with pytest.raises(ValueError, match="out of range") as info:
        build_compressor(spec)
    message = str(info.value)
    assert f"'{param}'" in message
    assert "valid:" in message
    assert "<=" in message  # the range itself is spelled out


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("powersgd:rank=2.5", "expected int"),
        ("powersgd:rank=two", "expected int"),
        ("int8:chunk=1e3", "expected int"),
        ("topk:ratio=abc", "expected float"),
        ("topk:ef=maybe", "expected true or false"),
        ("randomk:unbiased=2", "expected true or false"),
        ("topk:ratio=nan", "finite"),
        ("topk:ratio=inf", "finite"),
    ],
)
def test_wrong_types_are_rejected(spec: str, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        build_compressor(spec)


def test_duplicated_key_is_rejected() -> None:
    with pytest.raises(ValueError, match="given twice"):
        build_compressor("topk:ratio=0.1,ratio=0.2")


@pytest.mark.parametrize(
    "spec", ["topk:ratio", "topk:ratio=", "topk:=0.1", "topk:ratio=0.1,", "topk:ratio=0.1,,ef=1"]
)
def test_malformed_parameters_show_the_expected_form(spec: str) -> None:
    with pytest.raises(ValueError, match="expected key=value"):
        build_compressor(spec)


@pytest.mark.parametrize("spec", ["", "   ", ":ratio=0.1"])
def test_empty_spec_lists_valid_names(spec: str) -> None:
    with pytest.raises(ValueError, match="empty compressor spec") as info:
        build_compressor(spec)
    for name in BUILTIN:
        assert name in str(info.value)


@pytest.mark.parametrize("spec", [None, 42, 0.5, b"topk", ["topk"], {"name": "topk"}])
def test_non_string_spec_is_a_type_error(spec: Any) -> None:
    with pytest.raises(TypeError, match="spec is a string"):
        build_compressor(spec)


# ---- property tests ------------------------------------------------------------------------

# Upper bounds for the property tests: keep tensors and padded chunks small.
_INT_CAP = {"chunk": 300, "rank": 8, "levels": 127}


@st.composite
def _valid_spec(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(BUILTIN))
    cls = available_compressors()[name]
    values: dict[str, Any] = {}
    for p in cls.params:
        if p.kind is bool:
            values[p.name] = draw(st.booleans())
        elif p.kind is int:
            low = int(p.low) + (1 if p.low_open else 0)
            high = min(int(p.high), _INT_CAP.get(p.name, 64))
            values[p.name] = draw(st.integers(low, high))
        else:
            values[p.name] = draw(
                st.floats(
                    min_value=p.low,
                    max_value=p.high,
                    exclude_min=p.low_open,
                    allow_nan=False,
                    allow_infinity=False,
                )
            )
    # Random subset of keys, in random order, with random case for bool words.
    keys = draw(st.permutations(list(values)))
    keys = keys[: draw(st.integers(0, len(keys)))]

    def text(v: Any) -> str:
        if isinstance(v, bool):
            return draw(
                st.sampled_from(["true", "True", "yes", "1"] if v else ["false", "NO", "0"])
            )
        return repr(v)

    body = ",".join(f"{k}={text(values[k])}" for k in keys)
    spec = f"{name}:{body}" if body else name
    expected = {p.name: values[p.name] if p.name in keys else p.default for p in cls.params}
    return spec, expected


_shapes = st.lists(st.integers(1, 6), min_size=0, max_size=4).map(tuple)


@given(_valid_spec())
@settings(max_examples=150, deadline=None)
def test_random_valid_specs_parse_and_round_trip(spec_and_values: tuple[str, dict]) -> None:
    spec, expected = spec_and_values
    c = build_compressor(spec)
    assert c.config == expected
    assert build_compressor(c.spec).spec == c.spec
    assert build_compressor(c.spec).config == c.config


def _strided_view(
    shape: tuple[int, ...], g: torch.Generator, how: str, scale: float
) -> torch.Tensor:
    """A view of ``scale * randn`` with logical shape ``shape``, non-contiguous if possible."""
    if how == "transpose" and len(shape) >= 2:
        base = torch.randn(tuple(reversed(shape)), generator=g).mul_(scale)
        return base.permute(*reversed(range(len(shape))))
    if how == "stride" and len(shape) >= 1:
        base = torch.randn((*shape[:-1], shape[-1] * 2), generator=g).mul_(scale)
        return base[..., ::2]
    return torch.randn(shape, generator=g).mul_(scale)


def _steps(c: Compressor, x: torch.Tensor, seed: int, steps: int = 2) -> list[torch.Tensor]:
    """Compress/decompress/commit ``steps`` times, checking the contract; return estimates."""
    state = c.init_state(x.shape, seed, 0)
    out = []
    for _ in range(steps):
        before = x.clone()
        expected = c.round_wire_bytes(x.shape, torch.float32)
        assert sum(expected) == c.wire_bytes(x.shape, torch.float32)
        payload = c.compress(x, state)
        for index in range(1, c.rounds_for(x.shape)):
            assert payload.numel() * payload.element_size() == expected[index - 1]
            payload = c.compress_round(x, index, payload, state)
        assert torch.equal(x, before)
        assert payload.dim() == 1
        assert payload.numel() * payload.element_size() == expected[-1]
        if c.collective is Collective.ALL_GATHER:
            assert payload.dtype == torch.uint8
        else:
            assert payload.dtype == c.payload_dtype(torch.float32)
        y = c.decompress(payload, x.shape, state)
        assert y.shape == x.shape
        assert torch.isfinite(y).all()
        c.commit(payload, state)
        out.append(y)
    return out


@given(
    spec_and_values=_valid_spec(),
    shape=_shapes,
    how=st.sampled_from(["transpose", "stride", "plain"]),
    scale=st.sampled_from([0.0, 1e-3, 1.0, 1e4]),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_specs_and_shapes_keep_the_contract(
    spec_and_values: tuple[str, dict], shape: tuple[int, ...], how: str, scale: float, seed: int
) -> None:
    spec, _ = spec_and_values
    c = build_compressor(spec)
    g = torch.Generator()
    g.manual_seed(seed)
    view = _strided_view(shape, g, how, scale)
    assert view.shape == shape
    # The hook hands compressors contiguous float32; compare with an independent fresh copy.
    from_view = view.contiguous()
    fresh = torch.tensor(view.tolist(), dtype=torch.float32).reshape(shape)
    assert from_view.is_contiguous() and fresh.is_contiguous()
    a = _steps(c, from_view, seed)
    b = _steps(c, fresh, seed)
    for ya, yb in zip(a, b, strict=True):
        assert torch.equal(ya, yb)


# ---- registry ------------------------------------------------------------------------------


def test_register_rejects_a_duplicate_name() -> None:
    with pytest.raises(ValueError, match="already registered"):

        @register_compressor
        class FakeTopK(Compressor):
            name: ClassVar[str] = "topk"

    assert available_compressors()["topk"].__name__ == "TopK"


def test_register_is_idempotent_for_the_same_class() -> None:
    cls = available_compressors()["topk"]
    assert register_compressor(cls) is cls
    assert available_compressors()["topk"] is cls


@pytest.mark.parametrize("bad_name", ["my:comp", "a,b", "", None])
def test_register_rejects_bad_names(bad_name: Any) -> None:
    attrs = {} if bad_name is None else {"name": bad_name}
    cls = type("BadName", (Compressor,), attrs)
    with pytest.raises(ValueError, match="name without"):
        register_compressor(cls)
    assert bad_name not in available_compressors()


@pytest.fixture
def scaled_identity():
    """A user compressor registered as ``scaledid`` for the duration of one test."""

    class ScaledIdentity(Compressor):
        name: ClassVar[str] = "scaledid"
        collective: ClassVar[Collective] = Collective.ALL_REDUCE
        params: ClassVar[tuple[Param, ...]] = (Param("factor", float, 2.0, low=0.0, low_open=True),)

        def wire_bytes(self, shape, dtype, state=None):
            return shape.numel() * 4

        def compress(self, x, state):
            return x.reshape(-1) * float(self.config["factor"])

        def decompress(self, payload, shape, state):
            return (payload / float(self.config["factor"])).reshape(shape)

    assert "scaledid" not in available_compressors()
    register_compressor(ScaledIdentity)
    try:
        yield ScaledIdentity
    finally:
        compressor_base._REGISTRY.pop("scaledid", None)


def test_user_compressor_is_buildable_from_a_spec(scaled_identity: type[Compressor]) -> None:
    assert available_compressors()["scaledid"] is scaled_identity
    c = build_compressor(" ScaledID:factor=4 ")
    assert isinstance(c, scaled_identity)
    assert c.spec == "scaledid:factor=4.0"
    assert build_compressor("scaledid").spec == "scaledid:factor=2.0"
    with pytest.raises(ValueError, match="out of range"):
        build_compressor("scaledid:factor=0")
    x = torch.arange(6.0).reshape(2, 3)
    payload = c.compress(x, {})
    assert torch.equal(payload, x.reshape(-1) * 4)
    assert torch.equal(c.decompress(payload, x.shape, {}), x)
    _steps(c, x, seed=0)


def test_registry_cleanup_removes_user_compressor() -> None:
    assert "scaledid" not in available_compressors()
    with pytest.raises(ValueError, match="unknown compressor"):
        build_compressor("scaledid")


def test_available_compressors_is_a_copy() -> None:
    snapshot = available_compressors()
    snapshot["bogus"] = available_compressors()["none"]
    assert "bogus" not in available_compressors()
    assert len(available_compressors()) == len(snapshot) - 1


@pytest.mark.parametrize("spec", [*BUILTIN, "qsgd:levels=3,chunk=5", "powersgd:rank=2"])
def test_non_contiguous_views_compress_like_fresh_copies(spec: str) -> None:
    g = torch.Generator()
    g.manual_seed(3)
    views = [
        torch.randn(9, 8, generator=g).T,  # transposed (8, 9)
        torch.randn(6, 14, generator=g)[:, ::2],  # strided (6, 7)
        torch.randn(5, 4, 3, 2, generator=g).permute(3, 2, 1, 0),  # 4-D permuted
    ]
    c = build_compressor(spec)
    for view in views:
        assert not view.is_contiguous()
        fresh = torch.tensor(view.tolist(), dtype=torch.float32)
        for ya, yb in zip(_steps(c, view.contiguous(), 5), _steps(c, fresh, 5), strict=True):
            assert torch.equal(ya, yb)
            if spec == "none":
                assert torch.equal(ya, view)
