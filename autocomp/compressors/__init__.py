"""Gradient compressors, built from spec strings such as ``"topk:ratio=0.01"``.

Importing this package registers the built-in compressors: none, fp16, bf16, int8, qsgd,
sign, topk, randomk and powersgd. See ``docs/compressors.md`` for each one's wire format.
"""

from autocomp.compressors.base import (
    Collective,
    Compressor,
    Param,
    available_compressors,
    build_compressor,
    parse_spec,
    register_compressor,
    run_rounds_locally,
)
from autocomp.compressors.cast import BFloat16, Float16, NoCompression, effective_compressor
from autocomp.compressors.powersgd import PowerSGD
from autocomp.compressors.quantize import QSGD, Int8, Sign
from autocomp.compressors.sparse import RandomK, TopK

__all__ = [
    "QSGD",
    "BFloat16",
    "Collective",
    "Compressor",
    "Float16",
    "Int8",
    "NoCompression",
    "Param",
    "PowerSGD",
    "RandomK",
    "Sign",
    "TopK",
    "available_compressors",
    "build_compressor",
    "effective_compressor",
    "parse_spec",
    "register_compressor",
    "run_rounds_locally",
]
