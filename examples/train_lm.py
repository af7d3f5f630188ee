"""Train a byte-level LM on the Python standard library's source with DDP and autocomp.

    torchrun --nproc_per_node 2 examples/train_lm.py --steps 200
    torchrun --nproc_per_node 2 examples/train_lm.py --plan examples/plan_lm.json

Runs on CPU (gloo) or GPU (NCCL, one process per GPU). Each rank saves its own
autocomp state next to the model checkpoint, since error-feedback memory is per rank.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from autocomp_bench.workloads import MLPLanguageModel, text_batch, text_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--plan", default=None, help="JSON plan file (default: built-in plan)")
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else None
    if device is not None:
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    model = MLPLanguageModel().to(device or "cpu")
    ddp = DDP(model, device_ids=[device] if device is not None else None)
    plan = args.plan or {"*.bias": "none", "norm.*": "none", "fc*.weight": "powersgd:rank=4"}
    ctl = autocomp.wrap(ddp, plan=plan)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)

    split = text_split()
    for step in range(args.steps):
        x, y = text_batch(split.train, model.context, args.batch, rank, step)
        if device is not None:
            x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 50 == 0:
            stats = ctl.stats()
            print(f"step {step:4d} loss {loss.item():.3f} ratio {stats['compression_ratio']:.1f}x")

    if args.checkpoint_dir is not None:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"model": model.state_dict(), "opt": opt.state_dict(), "autocomp": ctl.state_dict()},
            args.checkpoint_dir / f"rank{rank}.pt",
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
