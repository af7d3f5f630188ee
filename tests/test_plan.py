"""Tier 1: pure unit tests, no processes.

Covers ``autocomp.plan``: rule resolution (first match wins, default ``none``, globs crossing
dots), every accepted plan form (None, Plan, dict, list of pairs, JSON file in both the
versioned and the plain-object layout, str or Path), the errors for malformed plans (bad
version, rules not a list, malformed rule, bad spec naming its glob, missing file naming its
path, invalid JSON, wrong type), ``unmatched_patterns``, the ``save``/``load_plan`` round trip
and ``assignment_digest`` sensitivity to names, specs and shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autocomp.compressors import build_compressor
from autocomp.plan import PLAN_FILE_VERSION, Plan, Rule, assignment_digest, load_plan

NAMES = [
    "embed.weight",
    "encoder.0.attn.weight",
    "encoder.0.attn.bias",
    "encoder.1.mlp.weight",
    "encoder.1.mlp.bias",
    "head.weight",
]


def _specs(plan: Plan, names: list[str] = NAMES) -> dict[str, str]:
    return {n: c.spec for n, c in plan.resolve(names).items()}


# ---- resolution ----------------------------------------------------------------------------


def test_first_match_wins() -> None:
    plan = load_plan(
        [
            ("*.bias", "none"),
            ("encoder.0.*", "fp16"),
            ("*.weight", "powersgd:rank=2"),
            ("encoder.*", "int8"),  # shadowed for weights by the rule above
        ]
    )
    assert _specs(plan) == {
        "embed.weight": "powersgd:rank=2,ef=true",
        "encoder.0.attn.weight": "fp16:ef=true",
        "encoder.0.attn.bias": "none",
        "encoder.1.mlp.weight": "powersgd:rank=2,ef=true",
        "encoder.1.mlp.bias": "none",
        "head.weight": "powersgd:rank=2,ef=true",
    }


def test_rule_order_matters() -> None:
    a = load_plan([("*.weight", "fp16"), ("head.*", "int8")])
    b = load_plan([("head.*", "int8"), ("*.weight", "fp16")])
    assert a.compressor_for("head.weight").name == "fp16"
    assert b.compressor_for("head.weight").name == "int8"


def test_dict_insertion_order_is_rule_order() -> None:
    plan = load_plan({"head.*": "int8", "*.weight": "fp16"})
    assert [r.pattern for r in plan.rules] == ["head.*", "*.weight"]
    assert plan.compressor_for("head.weight").name == "int8"
    assert plan.compressor_for("embed.weight").name == "fp16"


def test_default_is_none() -> None:
    for plan in (load_plan(None), load_plan({}), load_plan([]), Plan()):
        assert plan.rules == ()
        assert set(_specs(plan).values()) == {"none"}
    plan = load_plan({"head.*": "topk:ratio=0.1"})
    assert plan.compressor_for("embed.weight").spec == "none"


def test_globs_cross_dots_and_are_case_sensitive() -> None:
    plan = load_plan({"*weight": "fp16", "encoder.?.mlp.*": "int8"})
    assert plan.compressor_for("encoder.1.mlp.weight").name == "fp16"
    assert plan.compressor_for("encoder.1.mlp.bias").name == "int8"
    assert plan.compressor_for("encoder.12.mlp.bias").name == "none"  # ? is one character
    assert plan.compressor_for("HEAD.WEIGHT").name == "none"


def test_resolve_keeps_the_given_order() -> None:
    plan = load_plan({"*": "fp16"})
    names = list(reversed(NAMES))
    assert list(plan.resolve(names)) == names


def test_plan_passes_through_and_rules_hold_compressors() -> None:
    plan = load_plan({"*.bias": "topk:ratio=0.5"})
    assert load_plan(plan) is plan
    assert plan.rules == (Rule("*.bias", build_compressor("topk:ratio=0.5")),)


# ---- JSON files ----------------------------------------------------------------------------


def test_versioned_json_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "default": "bf16:ef=false",
                "rules": [
                    {"match": "*.bias", "compressor": "none"},
                    {"match": "encoder.*.weight", "compressor": "powersgd:rank=4"},
                ],
            }
        )
    )
    for form in (path, str(path)):
        plan = load_plan(form)
        assert plan.default.spec == "bf16:ef=false"
        assert _specs(plan) == {
            "embed.weight": "bf16:ef=false",
            "encoder.0.attn.weight": "powersgd:rank=4,ef=true",
            "encoder.0.attn.bias": "none",
            "encoder.1.mlp.weight": "powersgd:rank=4,ef=true",
            "encoder.1.mlp.bias": "none",
            "head.weight": "bf16:ef=false",
        }


def test_versioned_json_defaults(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"rules": [{"match": "head.*", "compressor": "int8"}]}))
    plan = load_plan(path)
    assert plan.default.spec == "none"
    assert plan.compressor_for("head.weight").spec == "int8:chunk=256,ef=true"


def test_plain_object_json_file(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"*.bias": "none", "*": "topk:ratio=0.05"}))
    plan = load_plan(path)
    assert plan.default.spec == "none"
    assert plan.compressor_for("head.bias").spec == "none"
    assert plan.compressor_for("head.weight").spec == "topk:ratio=0.05,ef=true"


def test_unsupported_version(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"version": 2, "rules": []}))
    with pytest.raises(ValueError, match="version 2 is not supported"):
        load_plan(path)
    with pytest.raises(ValueError, match="version"):
        load_plan({"version": 2, "rules": []})


def test_rules_must_be_a_list(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"version": 1, "rules": {"*.bias": "none"}}))
    with pytest.raises(ValueError, match="'rules' must be a list"):
        load_plan(path)


@pytest.mark.parametrize(
    "rule",
    [
        {"match": "*.bias"},
        {"compressor": "none"},
        {"match": "*.bias", "compressor": "none", "extra": 1},
        ["*.bias", "none"],
        "*.bias=none",
    ],
)
def test_malformed_rule_objects(tmp_path: Path, rule: object) -> None:
    path = tmp_path / "plan.json"
    path.write_text(
        json.dumps({"version": 1, "rules": [{"match": "a", "compressor": "none"}, rule]})
    )
    with pytest.raises(ValueError, match=r"rules\[1\]"):
        load_plan(path)


def test_bad_spec_in_json_rule_names_the_glob(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    rules = [
        {"match": "*.bias", "compressor": "none"},
        {"match": "encoder.*.weight", "compressor": "topk:ratio=2"},
    ]
    path.write_text(json.dumps({"version": 1, "rules": rules}))
    with pytest.raises(ValueError) as info:
        load_plan(path)
    message = str(info.value)
    assert "'encoder.*.weight'" in message
    assert "ratio" in message  # the underlying spec error is kept
    assert str(path) in message


def test_bad_default_in_json_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"version": 1, "default": "nope", "rules": []}))
    with pytest.raises(ValueError, match="unknown compressor 'nope'"):
        load_plan(path)


@pytest.mark.parametrize(
    "plan",
    [
        {"head.*": "powersgd:rank=0"},
        [("*.bias", "none"), ("head.*", "powersgd:rank=0")],
    ],
)
def test_bad_spec_in_python_plan_names_the_glob(plan: object) -> None:
    with pytest.raises(ValueError, match=r"'head\.\*'.*rank"):
        load_plan(plan)


def test_non_string_spec_in_rule_becomes_value_error() -> None:
    with pytest.raises(ValueError, match=r"'head\.\*'"):
        load_plan({"head.*": 3})


@pytest.mark.parametrize("pattern", ["", 5, None])
def test_rule_glob_must_be_a_non_empty_string(pattern: object) -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        load_plan([(pattern, "none")])


@pytest.mark.parametrize("item", [("*.bias",), ("*.bias", "none", "extra"), "*.bias", 7])
def test_list_items_must_be_pairs(item: object) -> None:
    with pytest.raises(ValueError, match=r"plan\[1\] must be a \(glob, spec\) pair"):
        load_plan([("*", "none"), item])


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "no_such_plan.json"
    for form in (path, str(path)):
        with pytest.raises(ValueError, match="does not exist") as info:
            load_plan(form)
        assert str(path) in str(info.value)


def test_directory_is_not_a_plan_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_plan(tmp_path)


@pytest.mark.parametrize("text", ["{not json", "", '{"a": "none",}', "\udcff"])
def test_invalid_json(tmp_path: Path, text: str) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError, match="not valid JSON") as info:
        load_plan(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("data", [["*.bias", "none"], "none", 42, None])
def test_json_top_level_must_be_an_object(tmp_path: Path, data: object) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="a plan is a JSON object"):
        load_plan(path)


@pytest.mark.parametrize("plan", [42, 3.5, object(), {1, 2}])
def test_wrong_type_is_a_type_error(plan: object) -> None:
    with pytest.raises(TypeError, match="plan must be a dict"):
        load_plan(plan)


# ---- typos, save/load, digest --------------------------------------------------------------


def test_unmatched_patterns_reports_typos() -> None:
    plan = load_plan(
        [
            ("*.bias", "none"),
            ("encoder.*.wieght", "int8"),  # typo
            ("head.*", "fp16"),
            ("decoder.*", "topk"),  # no such module
        ]
    )
    assert plan.unmatched_patterns(NAMES) == ["encoder.*.wieght", "decoder.*"]
    assert plan.unmatched_patterns(iter(NAMES)) == ["encoder.*.wieght", "decoder.*"]
    assert load_plan({"*": "fp16"}).unmatched_patterns(NAMES) == []
    assert load_plan({"*": "fp16"}).unmatched_patterns([]) == ["*"]


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    plan = load_plan(
        {
            "*.bias": "none",
            "encoder.*": "powersgd:rank=2",
            "head.weight": "topk:ef=false,ratio=0.10",
            "*": "qsgd:levels=3",
        }
    )
    plan = Plan(plan.rules, build_compressor("bf16"))
    path = tmp_path / "sub_plan.json"
    plan.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == PLAN_FILE_VERSION
    assert data["default"] == "bf16:ef=true"
    assert data["rules"][2] == {"match": "head.weight", "compressor": "topk:ratio=0.1,ef=false"}
    loaded = load_plan(path)
    assert loaded == plan
    assert [(r.pattern, r.compressor.spec) for r in loaded.rules] == [
        (r.pattern, r.compressor.spec) for r in plan.rules
    ]
    assert loaded.default.spec == "bf16:ef=true"
    assert _specs(loaded) == _specs(plan)
    # Saving the loaded plan reproduces the file byte for byte.
    again = tmp_path / "again.json"
    loaded.save(again)
    assert again.read_text() == path.read_text()


SHAPES = {"a.weight": (4, 3), "a.bias": (4,), "b.weight": (2, 2, 3, 3)}


def _assignment(**overrides: str) -> dict:
    specs = {"a.weight": "powersgd:rank=2", "a.bias": "none", "b.weight": "topk:ratio=0.1"}
    specs.update({k.replace("_", "."): v for k, v in overrides.items()})
    return {name: build_compressor(spec) for name, spec in specs.items()}


def test_assignment_digest_equal_for_equal_inputs() -> None:
    d1 = assignment_digest(_assignment(), SHAPES)
    d2 = assignment_digest(_assignment(), dict(SHAPES))
    assert isinstance(d1, bytes) and len(d1) == 32
    assert d1 == d2
    # Insertion order does not matter, and equal specs spelled differently hash alike.
    reordered = dict(reversed(list(_assignment(b_weight="topk:ef=true,ratio=0.10").items())))
    assert assignment_digest(reordered, SHAPES) == d1


def test_assignment_digest_detects_one_spec_change() -> None:
    base = assignment_digest(_assignment(), SHAPES)
    assert assignment_digest(_assignment(b_weight="topk:ratio=0.2"), SHAPES) != base
    assert assignment_digest(_assignment(a_bias="fp16"), SHAPES) != base
    assert assignment_digest(_assignment(a_weight="powersgd:rank=2,ef=false"), SHAPES) != base


def test_assignment_digest_detects_one_shape_change() -> None:
    base = assignment_digest(_assignment(), SHAPES)
    transposed = {**SHAPES, "a.weight": (3, 4)}  # same numel, different shape
    assert assignment_digest(_assignment(), transposed) != base
    flattened = {**SHAPES, "b.weight": (2, 18)}
    assert assignment_digest(_assignment(), flattened) != base


def test_assignment_digest_detects_a_renamed_parameter() -> None:
    base = assignment_digest(_assignment(), SHAPES)
    renamed = {("c.bias" if k == "a.bias" else k): v for k, v in _assignment().items()}
    shapes = {("c.bias" if k == "a.bias" else k): v for k, v in SHAPES.items()}
    assert assignment_digest(renamed, shapes) != base
