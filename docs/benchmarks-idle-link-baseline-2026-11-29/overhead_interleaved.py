"""What autocomp costs on an all-uncompressed plan, interleaved in blocks of 10 steps.

One pair of gloo ranks on loopback holds four DDP copies of a tta task's model: plain DDP,
DDP with PyTorch's Python all-reduce hook, autocomp adaptive pinned to 'none', and autocomp
as a user calls it (``autocomp.wrap(ddp, target_overlap=0.9)``). They take turns every 10
steps (the order rotates), so the machine's drift from minute to minute falls on all four
alike; a background thread's cost does too, which this design cannot charge to its owner.

    .venv/bin/python docs/benchmarks-idle-link-baseline-2026-11-29/overhead_interleaved.py mlp-lm 50
"""
import datetime, json, os, statistics, sys, tempfile, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp
from autocomp_bench.tasks import build_task

TASK = sys.argv[1] if len(sys.argv) > 1 else "mlp-lm"
BLOCKS = int(sys.argv[2]) if len(sys.argv) > 2 else 40
BLOCK = 10
MODES = ["ddp", "torch_hook", "adaptive", "free"]

def main(rank, world, store, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    spec = build_task(TASK)
    runs = {}
    for mode in MODES:
        torch.manual_seed(0)
        ddp = DDP(spec.build_model())
        ctl = None
        if mode == "torch_hook":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        elif mode == "static":
            ctl = autocomp.wrap(ddp, plan={"*": "none"})
        elif mode == "adaptive":
            ctl = autocomp.wrap(ddp, plan={"*": "none"}, target_overlap=0.9, window=50, warmup_steps=0)
        elif mode == "free":
            ctl = autocomp.wrap(ddp, target_overlap=0.9)
        runs[mode] = (ddp, spec.make_optimizer(ddp.parameters()), ctl, [0])
    times = {m: [] for m in MODES}
    for b in range(BLOCKS):
        order = MODES[b % len(MODES):] + MODES[:b % len(MODES)]
        for mode in order:
            ddp, opt, ctl, counter = runs[mode]
            for _ in range(BLOCK):
                x, y = spec.batch(rank, counter[0], 0)
                counter[0] += 1
                t = time.perf_counter()
                loss = spec.loss(ddp(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if b > 0:
                    times[mode].append(time.perf_counter() - t)
    for _, _, ctl, _ in runs.values():
        if ctl is not None:
            ctl.close()
    if rank == 0:
        json.dump(times, open(out, "w"))
    dist.destroy_process_group()

if __name__ == "__main__":
    d = tempfile.mkdtemp()
    out = os.path.join(d, "t.json")
    mp.spawn(main, args=(2, os.path.join(d, "store"), out), nprocs=2)
    times = json.load(open(out))
    ddp = statistics.median(times["ddp"])
    for m in MODES:
        med = statistics.median(times[m])
        print(f"{TASK} {m:11s} median {med*1e3:.2f} ms  x{med/ddp:.3f}  mean {statistics.mean(times[m])*1e3:.2f}")
    # per-block ratio vs ddp
    n = BLOCK
    import itertools
    for m in MODES[1:]:
        ratios = [statistics.median(times[m][i:i+n]) / statistics.median(times["ddp"][i:i+n]) for i in range(0, len(times[m]), n)]
        print(f"  {m}: block-median ratio vs ddp: median {statistics.median(ratios):.3f}, quartiles {statistics.quantiles(ratios, n=4)}")
