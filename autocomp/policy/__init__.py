"""The policy: rule tables (presets as TOML data), error estimates, the plan search and the
engine that combines them into a per-layer plan with a reason for every layer.

- :mod:`autocomp.policy.types`: inputs and outputs (layer profiles, timing, decisions);
- :mod:`autocomp.policy.rules`: :class:`PolicyRules`, :func:`load_policy`, presets;
- :mod:`autocomp.policy.priors`: measured and prior relative errors per option;
- :mod:`autocomp.policy.optimizer`: multiple-choice knapsack over a discretized time budget;
- :mod:`autocomp.policy.plan_load`: a plan's load per bucket group, summed exactly, and
  the single-layer moves the searches price;
- :mod:`autocomp.policy.search`: least error within the time slack of the fastest plan;
- :mod:`autocomp.policy.explain`: the reasons;
- :mod:`autocomp.policy.engine`: :class:`PolicyEngine`, rules first, then the search;
- :mod:`autocomp.policy.payoff`: compression held off where measured steps show no gain.

Predicted and measured exposure both come from :mod:`autocomp.exposure`.
"""

from autocomp.policy.engine import PolicyEngine
from autocomp.policy.optimizer import BudgetOptimizer, BudgetSolution, LayerChoice, LayerOption
from autocomp.policy.priors import ErrorPriors
from autocomp.policy.rules import (
    GuardRules,
    Pin,
    PolicyRules,
    available_policies,
    load_policy,
    presets_dir,
)
from autocomp.policy.types import (
    CostModelProtocol,
    LayerDecision,
    LayerProfile,
    PolicyDecision,
    StepTiming,
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
