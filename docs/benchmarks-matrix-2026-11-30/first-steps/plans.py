"""Per-step quality of whole static plans: ``plan:GLOB=SPEC,GLOB=SPEC`` (first match wins,
';'-separated methods, specs with commas written with '+' for ','), after 2 uncompressed
steps as the quality bench's ``autocomp:SPEC``. Runs autocomp-bench quality.
    PYTHONPATH=.:THIS_FOLDER python plans.py [quality args]"""
import sys
import autocomp_bench.quality as q
_attach, _validate, _reference = q._attach, q._validate_method, q.reference_of
def parse(method):
    pairs = [item.split("=", 1) for item in method.split(":", 1)[1].split(",")]
    return {glob: spec.replace("+", ",") for glob, spec in pairs}
def attach(method, model, seed):
    if method.startswith("plan:"):
        import autocomp
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model)
        return ddp, autocomp.wrap(ddp, plan=parse(method), seed=seed, warmup_steps=2)
    return _attach(method, model, seed)
def base(method):
    return "autocomp:powersgd:rank=4" if method.startswith("plan:") else method
q._attach, q._validate_method = attach, lambda m: _validate(base(m))
q.reference_of = lambda m: _reference(base(m))
q._split_methods = lambda text: tuple(m.strip() for m in text.split(";") if m.strip())
if __name__ == "__main__":
    sys.exit(q.main(sys.argv[1:]))
