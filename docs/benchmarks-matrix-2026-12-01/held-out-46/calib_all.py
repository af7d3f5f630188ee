"""Rank 0's calibration factors for mlp-lm's candidates: rank 0 alone vs both ranks at once."""
import datetime, os, sys, tempfile, time, logging
import torch, torch.distributed as dist, torch.multiprocessing as mp
from autocomp.cost_model import CostModel
from autocomp.opening import calibrate, calibration_shape_for, CALIBRATION_SHAPE
from autocomp.policy.rules import PolicyRules
def main(rank, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
    from autocomp_bench.tasks import build_task
    m = build_task(sys.argv[1]).build_model()
    shapes = [p.shape for p in m.parameters()]
    big = calibration_shape_for(shapes)
    cands = ["fp16:ef=false", "int8:chunk=256,ef=true", "powersgd:rank=16,ef=true", "powersgd:rank=4,ef=true", "topk:ratio=0.01,ef=true"]
    for rep in range(3):
        for mode in ("alone", "both"):
            dist.barrier()
            if rank == 0 or mode == "both":
                cm = CostModel(CostModel.Config(world_size=2))
                calibrate(cm, cands, 2, torch.device("cpu"), large_shape=big)
                if rank == 0:
                    row = []
                    for c in cands:
                        row.append(f"{c.split(',')[0]} 1M {cm.compress_seconds(c, CALIBRATION_SHAPE)*1e3:.2f}" + (f" big {cm.compress_seconds(c, big)*1e3:.2f}" if big is not None else ""))
                    print(rep, mode, " | ".join(row), flush=True)
            dist.barrier()
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(main, args=(tempfile.mktemp(),), nprocs=2)
