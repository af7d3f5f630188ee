"""``AutocompConfig``: every setting of a wrapped model, as one value frameworks can pass around.

``autocomp.wrap(ddp, ...)`` takes the same settings as keyword arguments and builds one of
these; :func:`autocomp.make_hook` takes one directly, for frameworks that own the DDP wrapper
(Lightning's ``DDPStrategy(ddp_comm_state=..., ddp_comm_hook=...)``, accelerate, HF Trainer).
:meth:`AutocompConfig.from_toml` reads a policy preset (or a policy file with an extra
``[autocomp]`` table of these fields), so a job's whole configuration can live in one file.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autocomp.plan import Plan, load_plan
from autocomp.policy.rules import (
    POLICY_SUFFIX,
    PolicyRules,
    load_policy,
    parse_policy,
    presets_dir,
)

__all__ = ["AutocompConfig", "ResolvedConfig"]

_FIELDS_IN_TOML = (
    "plan",
    "target_overlap",
    "window",
    "warmup_steps",
    "seed",
    "run_dir",
    "first_look_steps",
    "opening",
    "sampled_steps",
    "quiet_window_seconds",
    "hierarchy",
)


@dataclass(kw_only=True, slots=True)
class AutocompConfig:
    """Settings of one wrapped model; every rank must hold equal values (checked)."""

    plan: Plan | Mapping[str, str] | list[tuple[str, str]] | str | None = None
    """Parameter-name globs mapped to compressor specs (first match wins, default ``none``),
    as a dict, a list of pairs, a :class:`~autocomp.plan.Plan` or the path of a JSON plan
    file. Alone: the static plan. With ``target_overlap`` or ``policy``: pins."""
    target_overlap: float | None = None
    """Fraction of communication to hide behind backward compute (adaptive; default: the
    policy's, 0.9)."""
    policy: str | Path | PolicyRules | None = None
    """Preset name (``default``, ``datacenter``, ``cloud-ethernet``, ``wan``, ``federated``),
    path of a TOML policy, or :class:`~autocomp.policy.rules.PolicyRules` (adaptive)."""
    window: int | None = None
    """Steps between decisions (adaptive; default: the policy's ``replan_interval``)."""
    warmup_steps: int | None = None
    """Uncompressed steps at the start (adaptive: default the policy's; static: 0)."""
    seed: int | None = None
    """Base seed of shared random choices (default ``AUTOCOMP_SEED`` or 0)."""
    run_dir: str | Path | bool | None = None
    """Rank 0's run log directory (adaptive): None for ``./autocomp-runs/<run-id>`` (or
    ``AUTOCOMP_RUN_DIR``), False for none."""
    dashboard: bool | int = False
    """True or a port: rank 0 starts the sidecar (needs a run log)."""
    first_look_steps: int = 2
    """Step of the early boundary that may end the warm-up on a slow link, looked at again
    at twice this step (adaptive)."""
    opening: bool = True
    """Probe the link before step 0's first collective and compress that step already when
    an uncompressed one would be communication-bound (adaptive; needs the DDP model)."""
    sampled_steps: int = 2
    """Steps per window whose gradient norms and errors are measured (adaptive)."""
    quiet_window_seconds: float = 2.0
    """While every layer stays uncompressed and nothing is pending, boundaries come about
    this many seconds apart instead of every window (adaptive; 0: every window)."""
    hierarchy: str | bool = "auto"
    """Reduce at full precision inside each node and compress only across nodes: ``"auto"``
    (when the job spans several nodes of more than one rank each and the link inside a node
    times ``AUTOCOMP_NODE_LINK_MIN_ADVANTAGE`` x faster than the one between them at wrap),
    True or False."""

    @property
    def adaptive(self) -> bool:
        """Adaptive without a plan, or with a target or a policy; static otherwise."""
        return self.plan is None or self.target_overlap is not None or self.policy is not None

    @classmethod
    def from_toml(cls, source: str | Path, **overrides: Any) -> AutocompConfig:
        """An adaptive configuration from a policy preset name or TOML file.

        The file may carry an ``[autocomp]`` table with any of ``plan`` (a table of glob =
        spec), ``target_overlap``, ``window``, ``warmup_steps``, ``seed``, ``run_dir``,
        ``first_look_steps``, ``opening``, ``sampled_steps``, ``quiet_window_seconds`` and
        ``hierarchy``; the rest of the file is the policy (schema in
        ``policies/default.toml``). Keyword arguments override both.
        """
        fields: dict[str, Any] = {}
        text = str(source)
        if not text.endswith(POLICY_SUFFIX) and presets_dir() is not None and "/" not in text:
            rules = load_policy(text)  # a preset name: nothing but the policy
        else:
            path = Path(source)
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except OSError as err:
                raise ValueError(f"cannot read autocomp config {path}: {err}") from None
            except tomllib.TOMLDecodeError as err:
                raise ValueError(f"{path}: not valid TOML: {err}") from None
            table = data.pop("autocomp", {})
            if not isinstance(table, Mapping):
                raise ValueError(f"{path}: [autocomp] must be a table")
            unknown = sorted(set(table) - set(_FIELDS_IN_TOML))
            if unknown:
                raise ValueError(
                    f"{path}: unknown key(s) {unknown} in [autocomp]; valid: "
                    f"{', '.join(_FIELDS_IN_TOML)}"
                )
            fields.update(table)
            rules = parse_policy(data, name=path.stem, source=str(path))
        config = cls(policy=rules, **fields)
        config.target_overlap = (
            rules.target_overlap if config.target_overlap is None else config.target_overlap
        )
        return dataclasses.replace(config, **overrides)

    def resolve(self) -> ResolvedConfig:
        """Validated settings with the policy loaded; ValueError/TypeError naming what is bad."""
        rules = load_plan(self.plan)
        adaptive = self.adaptive
        warmup = self.warmup_steps
        if warmup is not None:
            if isinstance(warmup, bool) or not isinstance(warmup, int):
                raise TypeError(f"warmup_steps must be an int, got {warmup!r}")
            if warmup < 0:
                raise ValueError(f"warmup_steps must be >= 0, got {warmup}")
        for name in ("first_look_steps", "sampled_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        quiet = self.quiet_window_seconds
        if isinstance(quiet, bool) or not isinstance(quiet, (int, float)) or not quiet >= 0:
            raise ValueError(f"quiet_window_seconds must be a number >= 0, got {quiet!r}")
        if not isinstance(self.opening, bool):
            raise TypeError(f"opening must be True or False, got {self.opening!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise TypeError(f"seed must be an int, got {self.seed!r}")
        if self.hierarchy != "auto" and not isinstance(self.hierarchy, bool):
            raise ValueError(f"hierarchy must be 'auto', True or False, got {self.hierarchy!r}")
        policy_rules: PolicyRules | None = None
        target = window = None
        if adaptive:
            policy_rules = load_policy(self.policy if self.policy is not None else "default")
            if warmup is not None:
                policy_rules = dataclasses.replace(policy_rules, warmup_steps=warmup)
            target = (
                policy_rules.target_overlap if self.target_overlap is None else self.target_overlap
            )
            if isinstance(target, bool) or not isinstance(target, (int, float)):
                raise TypeError(f"target_overlap must be a number in [0, 1], got {target!r}")
            if not 0.0 <= float(target) <= 1.0:
                raise ValueError(f"target_overlap must be in [0, 1], got {target}")
            window = policy_rules.replan_interval if self.window is None else self.window
            if isinstance(window, bool) or not isinstance(window, int):
                raise TypeError(f"window must be an int, got {window!r}")
            if window < 1:
                raise ValueError(f"window must be >= 1, got {window}")
        elif self.dashboard:
            raise ValueError(
                "dashboard=... needs adaptive mode (it shows the per-window decisions)"
            )
        return ResolvedConfig(
            source=self,
            rules=rules,
            adaptive=adaptive,
            policy=policy_rules,
            target_overlap=None if target is None else float(target),
            window=window,
            warmup_steps=warmup,
        )


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """An :class:`AutocompConfig` after validation, with its plan and policy loaded."""

    source: AutocompConfig
    rules: Plan
    """The plan rules (static plan, or pins in adaptive mode)."""
    adaptive: bool
    policy: PolicyRules | None
    """The policy with ``warmup_steps`` applied (adaptive only)."""
    target_overlap: float | None
    window: int | None
    warmup_steps: int | None
    """As given (None: the policy's in adaptive mode, 0 in static mode)."""

    def digest_fields(self) -> tuple[Any, ...]:
        """What every rank must agree on besides the model (for the cross-rank check)."""
        s = self.source
        return (
            tuple((r.pattern, r.compressor.spec) for r in self.rules.rules),
            self.adaptive,
            repr(self.policy),
            self.target_overlap,
            self.window,
            self.warmup_steps,
            s.first_look_steps,
            s.opening,
            s.sampled_steps,
            float(s.quiet_window_seconds),
            s.hierarchy,
        )
