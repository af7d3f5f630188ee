"""The offline advisor: profile a DDP script once, then ask what compression would do elsewhere.

``autocomp-advisor profile train.py`` runs the unmodified script for a few steps and records
per-layer gradient sizes, the backward's bucket-ready timeline, step times, the link between
the ranks and compression costs on this machine (:mod:`autocomp.advisor.capture`). ``recommend``
predicts step time and scaling efficiency for each option on a what-if link and world size
(:mod:`autocomp.advisor.whatif`) and renders the advice (:mod:`autocomp.advisor.report`).
See docs/advisor.md.
"""

from __future__ import annotations

from autocomp.advisor.profile import PROFILE_VERSION, Profile, ProfileError
from autocomp.advisor.whatif import OPTIONS, Scenario, WhatIfModel, simulate_pipeline

__all__ = [
    "OPTIONS",
    "PROFILE_VERSION",
    "Profile",
    "ProfileError",
    "Scenario",
    "WhatIfModel",
    "simulate_pipeline",
]
