"""Interleaved 2-rank gloo A/B of the fp16 path on one task (loopback): DDP, PyTorch's fp16 hook,
autocomp static fp16 on the largest matrix with the zero-copy _flat (new) and with the copy (old).
    PYTHONPATH=. python /tmp/s39/fp16ab.py TASK LAYER STEPS ROUNDS OUT.json"""
import datetime, json, statistics, sys, tempfile, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp, autocomp.hook as hook
from autocomp_bench.overhead import _workload

NEW_FLAT = hook._flat
def OLD_FLAT(parts):
    return torch.cat([p.encoding.payload.reshape(-1) for p in parts])
MODES = ("ddp", "torch_fp16", "ac_new", "ac_old")

def run(mode, rank, steps, task, layer):
    torch.manual_seed(0)
    model, make_opt, batch, loss_fn = _workload(task)
    ddp = DDP(model); ctl = None
    hook._flat = OLD_FLAT if mode == "ac_old" else NEW_FLAT
    if mode == "torch_fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif mode.startswith("ac_"):
        ctl = autocomp.wrap(ddp, plan={layer: "fp16:ef=false", "*": "none"})
    opt = make_opt(ddp.parameters()); times = []
    for step in range(steps):
        x, y = batch(rank, step)
        s = time.perf_counter()
        loss = loss_fn(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
        times.append(time.perf_counter() - s)
    if ctl is not None: ctl.close()
    return times[2:]

def main(rank, world, store, task, layer, steps, rounds, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    res = []
    for r in range(rounds):
        order = MODES[r % 4:] + MODES[:r % 4]
        res.append({m: run(m, rank, steps, task, layer) for m in order})
    if rank == 0:
        json.dump(res, open(out, "w"))
        meds = {m: [statistics.median(x[m]) for x in res] for m in MODES}
        for m in MODES:
            print(f"{m:11s} median over rounds {statistics.median(meds[m])*1e3:7.2f} ms  rounds " + " ".join(f"{v*1e3:.1f}" for v in meds[m]))
        for a, b in (("ac_new", "ac_old"), ("ac_new", "torch_fp16"), ("ac_old", "torch_fp16"), ("torch_fp16", "ddp"), ("ac_new", "ddp")):
            rat = [x / y for x, y in zip(meds[a], meds[b])]
            print(f"{a}/{b}: median {statistics.median(rat):.3f}  per round " + " ".join(f"{v:.3f}" for v in rat))
    dist.destroy_process_group()

if __name__ == "__main__":
    task, layer, steps, rounds, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    store = tempfile.mktemp()
    mp.spawn(main, args=(2, store, task, layer, steps, rounds, out), nprocs=2)
