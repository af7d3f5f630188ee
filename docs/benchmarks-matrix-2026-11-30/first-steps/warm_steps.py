"""Per-step quality of a static plan with and without uncompressed first steps:
``autocomp:SPEC`` (warmup_steps=2, the quality bench's default, as PyTorch's hook's
start_powerSGD_iter) against ``autocomp0:SPEC`` (compressed from step 0, as an opening that
compresses at step 0 does) and ``autocomp1:SPEC`` (one uncompressed step). Runs autocomp-bench quality with that one method added.
    PYTHONPATH=.:THIS_FOLDER python warm_steps.py [autocomp-bench quality args, methods split by ;]"""
import sys
import autocomp_bench.quality as q
_attach, _validate, _reference = q._attach, q._validate_method, q.reference_of
def attach(method, model, seed):
    if method.startswith(("autocomp0:", "autocomp1:")):
        import autocomp
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model)
        return ddp, autocomp.wrap(ddp, plan={"*": method.split(":", 1)[1]}, seed=seed, warmup_steps=int(method[8]))
    return _attach(method, model, seed)
def validate(method):
    return _validate("autocomp:" + method.split(":", 1)[1] if method.startswith(("autocomp0:", "autocomp1:")) else method)
def reference(method):
    return _reference("autocomp:" + method.split(":", 1)[1] if method.startswith(("autocomp0:", "autocomp1:")) else method)
q._attach, q._validate_method, q.reference_of = attach, validate, reference
def split(text):
    return tuple(m.strip() for m in text.split(";") if m.strip())
q._split_methods = split
if __name__ == "__main__":
    sys.exit(q.main(sys.argv[1:]))
