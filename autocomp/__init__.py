"""autocomp: per-layer gradient compression for PyTorch DDP, chosen for the link you have.

Quick start::

    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ctl = autocomp.wrap(ddp, plan={"*.bias": "none", "*": "powersgd:rank=4"})
"""

from autocomp.compressors import available_compressors, build_compressor, register_compressor
from autocomp.controller import Controller, wrap
from autocomp.plan import Plan, load_plan

__all__ = [
    "Controller",
    "Plan",
    "available_compressors",
    "build_compressor",
    "load_plan",
    "register_compressor",
    "wrap",
]

__version__ = "0.1.0"
