# Adds two things to `autocomp-bench quality` for a scratch check (not in the package): the
# held-out 12-layer GPT (gpt-deep), and the method `plan:adaptive-s8`, a static autocomp plan
# equal to what adaptive ran on that model at 50 Mbit/s, seed 8 (int8 on the tied embedding
# and one attention output projection, fp16 on the position table, PowerSGD rank 4 on every
# other matrix). PYTHONPATH=docs/benchmarks-contention-2026-11-29/plan-quality
import importlib.util
import pathlib

_here = pathlib.Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "heldout_gpt12",
    _here.parent.parent / "benchmarks-heldout-gpt12-2026-11-26" / "sitecustomize.py",
)
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))

import autocomp_bench.quality as Q  # noqa: E402

PLANS = {
    "adaptive-s8": {
        "embed.weight": "int8:chunk=256,ef=true",
        "blocks.0.attn.out_proj.weight": "int8:chunk=256,ef=true",
        "position": "fp16:ef=false",
        "*": "powersgd:rank=4",
    }
}
_validate, _attach, _reference = Q._validate_method, Q._attach, Q.reference_of


def _validate_method(method):
    if method.startswith("plan:"):
        PLANS[method[5:]]  # KeyError names an unknown plan
        return
    _validate(method)


def _attach_plan(method, model, seed):
    if not method.startswith("plan:"):
        return _attach(method, model, seed)
    import autocomp

    ddp = Q.DDP(model)
    plan = PLANS[method[5:]]
    return ddp, autocomp.wrap(ddp, plan=plan, seed=seed, warmup_steps=Q.TORCH_POWERSGD_START_ITER)


def _reference_of(method):
    return "torch-powersgd:4" if method.startswith("plan:") else _reference(method)


Q._validate_method, Q._attach, Q.reference_of = _validate_method, _attach_plan, _reference_of
