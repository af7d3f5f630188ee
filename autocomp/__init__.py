"""autocomp: per-layer gradient compression for PyTorch DDP, chosen for the link you have.

Quick start::

    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ctl = autocomp.wrap(ddp, target_overlap=0.9)

The public names below are imported on first use, so light modules (the run log, the sidecar)
load without importing torch.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Ranks must decode the same bits from the same summed payload. By default MKL (the BLAS of
# PyTorch's x86 CPU wheels) picks code paths per process, and identical PowerSGD decodes came
# out a few ulps apart on different ranks, so their models drifted (1e-9 in one run in six of
# tests/test_hook_multirank.py). AUTO keeps the fastest path for the CPU but the same one in
# every process; it is read when MKL first runs, hence here, at import. A value the user set
# is kept. (CUDA and NCCL are not affected.)
os.environ.setdefault("MKL_CBWR", "AUTO")

_EXPORTS = {
    "AutocompConfig": "autocomp.config",
    "AutocompState": "autocomp.attach",
    "Controller": "autocomp.controller",
    "ElasticLoadPlanner": "autocomp.elastic_load",
    "make_hook": "autocomp.attach",
    "wrap": "autocomp.attach",
    "wrap_fsdp": "autocomp.fsdp",
    "Plan": "autocomp.plan",
    "load_plan": "autocomp.plan",
    "available_compressors": "autocomp.compressors",
    "build_compressor": "autocomp.compressors",
    "register_compressor": "autocomp.compressors",
}

__all__ = [
    "AutocompConfig",
    "AutocompState",
    "Controller",
    "ElasticLoadPlanner",
    "Plan",
    "available_compressors",
    "build_compressor",
    "load_plan",
    "make_hook",
    "register_compressor",
    "wrap",
    "wrap_fsdp",
]

if TYPE_CHECKING:
    from autocomp.attach import AutocompState, make_hook, wrap
    from autocomp.compressors import available_compressors, build_compressor, register_compressor
    from autocomp.config import AutocompConfig
    from autocomp.controller import Controller
    from autocomp.elastic_load import ElasticLoadPlanner
    from autocomp.fsdp import wrap_fsdp
    from autocomp.plan import Plan, load_plan


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autocomp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
