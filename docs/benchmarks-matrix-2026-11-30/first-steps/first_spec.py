"""Per-step quality of PowerSGD after different first steps: ``first:K:FIRST|SPEC`` sends
step(s) < K with FIRST (``plain`` = uncompressed), then SPEC on every layer (static plan,
switched between steps through the hook state's assign). Runs autocomp-bench quality.
    PYTHONPATH=.:THIS_FOLDER python first_spec.py [quality args, methods split by ;]"""
import sys
import autocomp_bench.quality as q
from autocomp.compressors import build_compressor
_attach, _validate, _reference = q._attach, q._validate_method, q.reference_of
def attach(method, model, seed):
    if method.startswith("first:"):
        import autocomp
        from torch.nn.parallel import DistributedDataParallel as DDP
        _, k, rest = method.split(":", 2)
        first, spec = rest.split("|")
        k = int(k)
        ddp = DDP(model)
        if first == "plain":
            return ddp, autocomp.wrap(ddp, plan={"*": spec}, seed=seed, warmup_steps=k)
        ctl = autocomp.wrap(ddp, plan={"*": first}, seed=seed, warmup_steps=0)
        count = [0]
        def pre(module, args):
            if module.training:
                count[0] += 1
                if count[0] == k + 1:
                    ctl._state.assign({n: build_compressor(spec) for n in ctl._state.slots})
        model.register_forward_pre_hook(pre)
        return ddp, ctl
    return _attach(method, model, seed)
def base(method):
    return "autocomp:" + method.split("|")[1] if method.startswith("first:") else method
def validate(method):
    return _validate(base(method))
def reference(method):
    return _reference(base(method))
q._attach, q._validate_method, q.reference_of = attach, validate, reference
q._split_methods = lambda text: tuple(m.strip() for m in text.split(";") if m.strip())
if __name__ == "__main__":
    sys.exit(q.main(sys.argv[1:]))
