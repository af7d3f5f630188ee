"""The policy engine: rule tables (presets as TOML data), the budgeted per-layer optimizer and
the engine that combines them into a per-layer plan with a reason for every layer.

- :mod:`autocomp.policy.rules`: :class:`PolicyRules`, :func:`load_policy`, presets;
- :mod:`autocomp.policy.optimizer`: multiple-choice knapsack over a discretized time budget;
- :mod:`autocomp.policy.engine`: :class:`PolicyEngine` and its inputs and outputs.
"""

from autocomp.policy.engine import (
    CostModelProtocol,
    ErrorPriors,
    LayerDecision,
    LayerProfile,
    PolicyDecision,
    PolicyEngine,
    StepTiming,
)
from autocomp.policy.optimizer import BudgetOptimizer, BudgetSolution, LayerChoice, LayerOption
from autocomp.policy.rules import (
    GuardRules,
    Pin,
    PolicyRules,
    available_policies,
    load_policy,
    presets_dir,
)

__all__ = [
    "BudgetOptimizer",
    "BudgetSolution",
    "CostModelProtocol",
    "ErrorPriors",
    "GuardRules",
    "LayerChoice",
    "LayerDecision",
    "LayerOption",
    "LayerProfile",
    "Pin",
    "PolicyDecision",
    "PolicyEngine",
    "PolicyRules",
    "StepTiming",
    "available_policies",
    "load_policy",
    "presets_dir",
]
