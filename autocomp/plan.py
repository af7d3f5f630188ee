"""Static per-layer plans: parameter-name globs mapped to compressor specs.

A plan is an ordered list of rules; for each parameter the first rule whose glob matches its
name wins, and parameters that no rule matches use the default (``none``). Plans come from a
dict (insertion order is rule order), a list of ``(glob, spec)`` pairs, or a JSON file::

    {"version": 1, "default": "none",
     "rules": [{"match": "*.bias", "compressor": "none"},
               {"match": "encoder.*.weight", "compressor": "powersgd:rank=4"}]}

A plain JSON object ``{"glob": "spec", ...}`` is accepted too.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autocomp.compressors import Compressor, build_compressor

logger = logging.getLogger(__name__)

PLAN_FILE_VERSION = 1


@dataclass(frozen=True, slots=True)
class Rule:
    """One plan line: parameters whose name matches ``pattern`` use ``compressor``."""

    pattern: str
    """fnmatch-style glob over the parameter's qualified name (``*`` crosses dots)."""
    compressor: Compressor
    """The compressor, already validated."""


@dataclass(frozen=True, slots=True)
class Plan:
    """An ordered rule list plus a default, resolved per parameter name."""

    rules: tuple[Rule, ...] = ()
    """Rules in priority order: first match wins."""
    default: Compressor = field(default_factory=lambda: build_compressor("none"))
    """Compressor for parameters that no rule matches."""

    def resolve(self, names: Iterable[str]) -> dict[str, Compressor]:
        """The compressor of every name, in the order given."""
        return {name: self.compressor_for(name) for name in names}

    def compressor_for(self, name: str) -> Compressor:
        for rule in self.rules:
            if fnmatch.fnmatchcase(name, rule.pattern):
                return rule.compressor
        return self.default

    def unmatched_patterns(self, names: Iterable[str]) -> list[str]:
        """Globs that match none of ``names`` (almost always a typo in the plan)."""
        names = list(names)
        return [
            r.pattern
            for r in self.rules
            if not any(fnmatch.fnmatchcase(n, r.pattern) for n in names)
        ]

    def to_json(self) -> dict[str, object]:
        return {
            "version": PLAN_FILE_VERSION,
            "default": self.default.spec,
            "rules": [{"match": r.pattern, "compressor": r.compressor.spec} for r in self.rules],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")


def _rule(pattern: object, spec: object, where: str) -> Rule:
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"{where}: a rule's glob must be a non-empty string, got {pattern!r}")
    try:
        compressor = build_compressor(spec)  # type: ignore[arg-type]
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}: rule {pattern!r}: {err}") from None
    return Rule(pattern, compressor)


def _from_json(data: object, where: str) -> Plan:
    if isinstance(data, dict) and "rules" in data:
        version = data.get("version", PLAN_FILE_VERSION)
        if version != PLAN_FILE_VERSION:
            raise ValueError(f"{where}: plan version {version!r} is not supported (expected 1)")
        rules = data["rules"]
        if not isinstance(rules, list):
            raise ValueError(f"{where}: 'rules' must be a list of {{match, compressor}} objects")
        parsed = []
        for i, item in enumerate(rules):
            if not isinstance(item, dict) or set(item) != {"match", "compressor"}:
                raise ValueError(
                    f"{where}: rules[{i}] must be an object with exactly 'match' and "
                    f"'compressor', got {item!r}"
                )
            parsed.append(_rule(item["match"], item["compressor"], where))
        default = _rule("*", data.get("default", "none"), where).compressor
        return Plan(tuple(parsed), default)
    if isinstance(data, dict):
        return Plan(tuple(_rule(k, v, where) for k, v in data.items()))
    raise ValueError(f"{where}: a plan is a JSON object, got {type(data).__name__}")


def load_plan(plan: object) -> Plan:
    """Build a :class:`Plan` from any accepted form; raise ValueError/TypeError if malformed."""
    if plan is None:
        return Plan()
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, (str, Path)):
        path = Path(plan)
        if not path.is_file():
            raise ValueError(
                f"plan file {str(path)!r} does not exist; pass a dict of glob -> spec or the "
                "path of a JSON plan"
            )
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"plan file {str(path)!r} is not valid JSON: {err}") from None
        return _from_json(data, f"plan file {str(path)!r}")
    if isinstance(plan, Mapping):
        return _from_json(dict(plan), "plan")
    if isinstance(plan, Sequence):
        rules = []
        for i, item in enumerate(plan):
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise ValueError(f"plan[{i}] must be a (glob, spec) pair, got {item!r}")
            rules.append(_rule(item[0], item[1], "plan"))
        return Plan(tuple(rules))
    raise TypeError(
        "plan must be a dict of glob -> spec, a list of (glob, spec) pairs, a Plan, or the "
        f"path of a JSON plan file; got {type(plan).__name__}"
    )


def assignment_digest(assignment: Mapping[str, Compressor], shapes: Mapping[str, object]) -> bytes:
    """SHA-256 over every parameter's name, shape and canonical spec, for cross-rank checks."""
    digest = hashlib.sha256()
    for name in sorted(assignment):
        digest.update(f"{name}\0{tuple(shapes[name])}\0{assignment[name].spec}\n".encode())
    return digest.digest()
