"""Tier 1: pure unit, no processes.

Covers ``autocomp.policy.rules``: every shipped preset loads and is sensible (canonical
candidates with 'none' first, valid pins and guards), ``default.toml`` equals the built-in
defaults, loading by name, by ``Path`` and by path string, preset lookup in the package data
directory before the repository's ``policies/``, and the ValueError raised for every kind of
bad file: invalid TOML, unknown tables and keys (with a suggestion), wrong types (``true`` is
not an integer), negative and out-of-range values, bad compressor specs in candidates and pins
(with build_compressor's message), duplicate candidates, malformed pins, unsupported version;
each message names the file and the key. Unknown presets list the available ones. The
``error_weight`` modes' per-layer weights.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from autocomp.compressors import build_compressor
from autocomp.policy import rules as rules_module
from autocomp.policy.rules import (
    GuardRules,
    Pin,
    PolicyRules,
    available_policies,
    load_policy,
    parse_policy,
    presets_dir,
)

PRESETS = ["cloud-ethernet", "datacenter", "default", "federated", "wan"]


def _write(tmp_path: Path, text: str, name: str = "custom.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> str:
    path = _write(tmp_path, text)
    with pytest.raises(ValueError) as info:
        load_policy(path)
    message = str(info.value)
    assert str(path) in message, message
    return message


# ---- presets -------------------------------------------------------------------------------


def test_available_policies_lists_every_preset_sorted() -> None:
    assert available_policies() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads(name: str) -> None:
    rules = load_policy(name)
    assert rules.name == name
    assert name in rules.source
    assert rules.description
    assert rules.candidates[0] == "none"
    assert len(rules.candidates) >= 3
    for spec in rules.candidates:
        assert build_compressor(spec).spec == spec  # canonical
    for pin in rules.pins:
        assert build_compressor(pin.compressor).spec == pin.compressor
    assert 0 < rules.target_overlap <= 1
    assert rules.fast_link_gbit > 0
    assert isinstance(rules.guards, GuardRules)


def test_presets_differ_in_aggressiveness() -> None:
    datacenter, wan, federated = (load_policy(n) for n in ("datacenter", "wan", "federated"))
    assert datacenter.fast_link_gbit > wan.fast_link_gbit > federated.fast_link_gbit
    assert federated.warmup_steps > wan.warmup_steps
    assert not any(s.startswith(("topk", "sign")) for s in datacenter.candidates)
    assert "sign:chunk=256,ef=true" in federated.candidates
    assert "topk:ratio=0.001,ef=true" in wan.candidates


def test_default_file_equals_builtin_defaults() -> None:
    loaded = load_policy("default")
    builtin = PolicyRules()
    assert dataclasses.replace(loaded, name=builtin.name, source=builtin.source) == builtin


def test_name_is_case_and_space_insensitive() -> None:
    assert load_policy(" WAN ") == load_policy("wan")


def test_unknown_preset_lists_available() -> None:
    with pytest.raises(ValueError, match="unknown policy preset 'lan'") as info:
        load_policy("lan")
    for name in PRESETS:
        assert name in str(info.value)


def test_rules_pass_through() -> None:
    rules = PolicyRules(warmup_steps=3)
    assert load_policy(rules) is rules


def test_wrong_argument_type() -> None:
    with pytest.raises(TypeError):
        load_policy(42)  # type: ignore[arg-type]


def test_packaged_directory_is_tried_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "autocomp"
    (package / "policies").mkdir(parents=True)
    (package / "policies" / "only.toml").write_text('[policy]\ndescription = "packaged"\n')
    monkeypatch.setattr(rules_module.importlib.resources, "files", lambda _: package)
    assert presets_dir() == package / "policies"
    assert available_policies() == ["only"]
    assert load_policy("only").description == "packaged"


def test_falls_back_to_repository_policies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules_module.importlib.resources, "files", lambda _: tmp_path)
    directory = presets_dir()
    assert directory is not None
    assert Path(str(directory)) == Path(rules_module.__file__).resolve().parents[2] / "policies"
    assert available_policies() == PRESETS


# ---- paths ---------------------------------------------------------------------------------


def test_load_by_path_and_path_string(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        [policy]
        warmup_steps = 7
        fast_link_gbit = inf
        candidates = ["none", "powersgd:rank=2"]
        [[pins]]
        match = "*.bias"
        compressor = "fp16"
        [guards]
        max_backoff_levels = 0
        """,
    )
    for source in (path, str(path)):
        rules = load_policy(source)
        assert rules.name == "custom"
        assert rules.warmup_steps == 7
        assert math.isinf(rules.fast_link_gbit)
        assert rules.candidates == ("none", "powersgd:rank=2,ef=true")
        assert rules.pins == (Pin("*.bias", "fp16:ef=true"),)
        assert rules.guards.max_backoff_levels == 0
        # Omitted keys keep the defaults.
        assert rules.min_numel == PolicyRules().min_numel
        assert rules.guards.loss_window == GuardRules().loss_window


def test_none_is_always_a_candidate(tmp_path: Path) -> None:
    rules = load_policy(_write(tmp_path, '[policy]\ncandidates = ["int8", "none", "sign"]\n'))
    assert rules.candidates == ("none", "int8:chunk=256,ef=true", "sign:chunk=256,ef=true")


def test_empty_file_is_the_defaults(tmp_path: Path) -> None:
    rules = load_policy(_write(tmp_path, ""))
    assert dataclasses.replace(rules, name="default", source=PolicyRules().source) == (
        PolicyRules()
    )


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist") as info:
        load_policy(tmp_path / "nope.toml")
    assert "nope.toml" in str(info.value)


def test_pin_matching_first_wins() -> None:
    rules = PolicyRules(pins=(("*.bias", "none"), ("enc*", "fp16")))
    assert rules.pin_for("enc.0.bias") == Pin("*.bias", "none")
    assert rules.pin_for("enc.0.weight") == Pin("enc*", "fp16:ef=true")
    assert rules.pin_for("head.weight") is None


def test_to_dict_is_json_friendly() -> None:
    import json

    data = load_policy("datacenter").to_dict()
    json.dumps(data, allow_nan=False)
    assert data["candidates"][0] == "none"
    inf = PolicyRules(fast_link_gbit=math.inf).to_dict()
    assert inf["fast_link_gbit"] == "inf"


# ---- bad files -----------------------------------------------------------------------------


def test_invalid_toml(tmp_path: Path) -> None:
    assert "not valid TOML" in _error(tmp_path, "[policy\nwarmup_steps = 1\n")


def test_unknown_top_level_key(tmp_path: Path) -> None:
    message = _error(tmp_path, "[polcy]\nwarmup_steps = 1\n")
    assert "unknown key 'polcy'" in message
    assert "did you mean 'policy'" in message


def test_unknown_policy_key_suggests(tmp_path: Path) -> None:
    message = _error(tmp_path, "[policy]\nwarmup_step = 1\n")
    assert "unknown key 'warmup_step' in [policy]" in message
    assert "did you mean 'warmup_steps'" in message


def test_unknown_guard_key(tmp_path: Path) -> None:
    assert "unknown key 'loss_spike' in [guards]" in _error(tmp_path, "[guards]\nloss_spike = 2\n")


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ('warmup_steps = "100"', "warmup_steps"),
        ("warmup_steps = true", "warmup_steps"),
        ("warmup_steps = 1.5", "warmup_steps"),
        ("compress_1d = 1", "compress_1d"),
        ("description = 3", "description"),
        ('fast_link_gbit = "fast"', "fast_link_gbit"),
        ("fast_link_gbit = nan", "fast_link_gbit"),
        ("replan_interval = 0", "replan_interval"),
    ],
)
def test_wrong_types(tmp_path: Path, line: str, key: str) -> None:
    message = _error(tmp_path, f"[policy]\n{line}\n")
    assert f"[policy] {key} must be" in message


@pytest.mark.parametrize(
    ("table", "line", "expected"),
    [
        ("policy", "min_numel = -1", "[policy] min_numel must be an integer >= 0, got -1"),
        ("policy", "warmup_steps = -5", "[policy] warmup_steps must be an integer >= 0"),
        ("policy", "fast_link_gbit = -1.0", "[policy] fast_link_gbit must be a number > 0"),
        ("policy", "fast_link_gbit = 0", "[policy] fast_link_gbit must be a number > 0"),
        ("policy", "target_overlap = 1.5", "[policy] target_overlap must be a number >= 0"),
        ("policy", "target_overlap = -0.1", "target_overlap"),
        ("guards", "loss_spike_ratio = 0.9", "[guards] loss_spike_ratio must be a number > 1"),
        ("guards", "residual_factor = -1", "[guards] residual_factor must be a number > 0"),
        ("guards", "max_backoff_levels = -1", "[guards] max_backoff_levels must be an integer"),
        ("guards", "loss_window = 0", "[guards] loss_window must be an integer >= 1"),
    ],
)
def test_out_of_range_values(tmp_path: Path, table: str, line: str, expected: str) -> None:
    assert expected in _error(tmp_path, f"[{table}]\n{line}\n")


def test_bad_candidate_spec_includes_compressor_message(tmp_path: Path) -> None:
    message = _error(tmp_path, '[policy]\ncandidates = ["none", "fp16", "topq:ratio=0.1"]\n')
    assert "[policy] candidates[2]" in message
    assert "unknown compressor 'topq'" in message  # build_compressor's own words
    message = _error(tmp_path, '[policy]\ncandidates = ["topk:ratio=2"]\n')
    assert "candidates[0]" in message and "out of range" in message


def test_candidates_must_be_a_list_of_strings(tmp_path: Path) -> None:
    assert "must be a list" in _error(tmp_path, '[policy]\ncandidates = "none"\n')
    assert "candidates[1] must be a compressor spec" in _error(
        tmp_path, '[policy]\ncandidates = ["none", 3]\n'
    )


def test_duplicate_candidates(tmp_path: Path) -> None:
    message = _error(tmp_path, '[policy]\ncandidates = ["powersgd", "powersgd:rank=4"]\n')
    assert "candidates[1]" in message and "repeats" in message


def test_bad_pin_spec(tmp_path: Path) -> None:
    message = _error(tmp_path, '[[pins]]\nmatch = "*embed*"\ncompressor = "int8:chunk=0"\n')
    assert "pins[0]" in message and "'*embed*'" in message
    assert "out of range" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[[pins]]\nmatch = "*"\n', "pins[0] is missing compressor"),
        ('[[pins]]\nmatch = "*"\ncompressor = "none"\nwhy = 1\n', "unknown key 'why'"),
        ('[[pins]]\nmatch = ""\ncompressor = "none"\n', "match must be a non-empty glob"),
        ('pins = "none"\n', "pins must be an array"),
        ("pins = [1]\n", "pins[0] must be a {match, compressor} table"),
    ],
)
def test_malformed_pins(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _error(tmp_path, text)


def test_tables_must_be_tables(tmp_path: Path) -> None:
    assert "[policy] must be a table" in _error(tmp_path, "policy = 3\n")


def test_unsupported_version(tmp_path: Path) -> None:
    assert "version 2 is not supported" in _error(tmp_path, "version = 2\n")


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ValueError, match=r"PolicyRules.min_numel must be an integer >= 0"):
        PolicyRules(min_numel=-3)
    with pytest.raises(ValueError, match=r"PolicyRules.candidates\[1\].*unknown compressor"):
        PolicyRules(candidates=("none", "zip"))
    with pytest.raises(ValueError, match=r"GuardRules\.loss_window"):
        GuardRules(loss_window=0)
    assert PolicyRules(candidates=("topk",)).candidates == ("none", "topk:ratio=0.01,ef=true")


def test_parse_policy_names_the_source() -> None:
    with pytest.raises(ValueError, match=r"^my source: "):
        parse_policy({"policy": {"min_numel": -1}}, name="x", source="my source")


def test_error_weight_modes() -> None:
    """Each ``error_weight`` mode's per-layer weight, and the opening's stand-in norm."""
    numel, norm = 4096, 0.5
    assert rules_module.error_weight("numel", numel, norm) == 4096.0
    assert rules_module.error_weight("grad_norm", numel, norm) == 0.25
    # sqrt(nonzero elements) x L2 norm: the L1 norm of a gradient whose entries are equal.
    assert rules_module.error_weight("grad_l1", numel, norm) == pytest.approx(64 * 0.5)
    assert rules_module.error_weight("grad_l1", numel, norm, 0.25) == pytest.approx(32 * 0.5)
    equal = [1e-3] * numel
    l2 = math.sqrt(math.fsum(g * g for g in equal))
    assert rules_module.error_weight("grad_l1", numel, l2) == pytest.approx(math.fsum(equal))
    # A measured L1 norm replaces the estimate; the other modes do not read it.
    assert rules_module.error_weight("grad_l1", numel, norm, 0.25, grad_l1=7.5) == 7.5
    assert rules_module.error_weight("grad_l1", numel, norm, grad_l1=0.0) == 0.0
    assert rules_module.error_weight("numel", numel, norm, grad_l1=7.5) == 4096.0
    assert rules_module.error_weight("grad_norm", numel, norm, grad_l1=7.5) == 0.25
    # Before any gradient the opening uses a norm of sqrt(numel): every mode weighs by size.
    for mode in rules_module.ERROR_WEIGHTS:
        assert rules_module.error_weight(mode, numel, math.sqrt(numel)) == pytest.approx(numel)
    with pytest.raises(ValueError, match="error_weight must be one of numel, grad_norm, grad_l1"):
        rules_module.error_weight("l2", numel, norm)
    with pytest.raises(ValueError, match=r"PolicyRules\.error_weight must be one of"):
        PolicyRules(error_weight="l1")
    assert PolicyRules(error_weight="grad_l1").error_weight == "grad_l1"
