import sys, tempfile
from pathlib import Path
sys.path.insert(0, "/work/main")
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tests.multirank import run_ranks
from tests.models import MultiBucketNet, classification_batch

def body(rank, world):
    import autocomp
    from autocomp import hook_cast_span
    out = {}
    for spans in (True, False):
        hook_cast_span.CAST_SPANS = spans
        torch.manual_seed(0)
        model = MultiBucketNet(); ddp = DDP(model, bucket_cap_mb=0.01)
        ctl = autocomp.wrap(ddp, target_overlap=0.9, plan={"*": "fp16:ef=false"}, window=4, warmup_steps=0)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        sampled = []
        for step in range(30):
            x, y = classification_batch(rank, step)
            opt.zero_grad(); torch.nn.functional.cross_entropy(ddp(x), y).backward(); opt.step()
            sampled.append(ctl._state.profiler.sample_this_step)
        out[spans] = (torch.cat([p.detach().reshape(-1) for p in model.parameters()]), sampled, dict(ctl.plan))
        ctl.close()
    return out

if __name__ == "__main__":
    res = run_ranks(body, 2, Path(tempfile.mkdtemp()))
    for r in res:
        a, b = r[True], r[False]
        print("equal params:", torch.equal(a[0], b[0]), "max diff", (a[0]-b[0]).abs().max().item(), "sampled same:", a[1] == b[1], sum(a[1]), "plans same:", a[2] == b[2])
