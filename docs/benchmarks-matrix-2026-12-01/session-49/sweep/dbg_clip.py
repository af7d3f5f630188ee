import sys; sys.path.insert(0, "/work/main")
from pathlib import Path
import tempfile
import torch, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
from tests.multirank import run_ranks
from tests.models import MultiBucketNet, EVERY_COMPRESSOR_PLAN
from tests.test_ddp_options import _classify, BUCKET_CAP_MB, STEPS

def one(rank, spec, clip):
    torch.manual_seed(0)
    model = MultiBucketNet()
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    ctl = autocomp.wrap(ddp, plan=spec)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loss_at = _classify(rank, ddp); losses = []; norms = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_at(step); loss.backward()
        n = nn.utils.clip_grad_norm_(ddp.parameters(), max_norm=0.5 if clip else 1e9)
        norms.append(float(n))
        opt.step(); losses.append(loss.item())
    ctl.close()
    return sum(losses[-3:]) / 3, sum(norms) / len(norms)

def body(rank, world):
    out = {}
    specs = {"none": {"*": "none"}, "every": EVERY_COMPRESSOR_PLAN}
    for k in ("sign", "powersgd:rank=4", "topk:ratio=0.1", "qsgd:levels=16", "int8", "randomk:ratio=0.5", "randomk:ratio=0.5,unbiased=false", "fp16"):
        specs[k] = {"*.weight": k, "*": "none"}
    for name, spec in specs.items():
        out[name] = (one(rank, spec, True), one(rank, spec, False))
    return out

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as t:
        res = run_ranks(body, 2, Path(t))
    for k, ((lc, nc), (lu, nu)) in res[0].items():
        print(f"{k:34s} clip: loss {lc:.3f} mean norm {nc:.3f}   noclip: loss {lu:.3f} norm {nu:.3f}")
