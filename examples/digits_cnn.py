"""Train a small CNN on scikit-learn's bundled 8x8 digits with plain DDP (no autocomp needed).

    torchrun --nproc_per_node 2 examples/digits_cnn.py --steps 300
    autocomp-advisor profile examples/digits_cnn.py --steps 20     # profile it as it is

Runs on CPU (gloo) or GPU (NCCL, one process per GPU). Each rank draws its own batches; the
validation accuracy printed by rank 0 is on the held-out 20% of the digits.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from autocomp_bench.workloads import DigitsCNN, digits, digits_batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--log-every", type=int, default=50)
    args = parser.parse_args(argv)

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else None
    if device is not None:
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # identical initial weights on every rank
    model = DigitsCNN().to(device or "cpu")
    ddp = DDP(model, device_ids=[device] if device is not None else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)

    for step in range(args.steps):
        x, y = digits_batch(args.batch, rank, step)
        if device is not None:
            x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step:4d} loss {loss.item():.3f}", flush=True)

    if rank == 0:
        _, _, valid_x, valid_y = digits()
        model.eval()  # the bare module: only rank 0 evaluates, so no DDP collectives
        with torch.no_grad():
            if device is not None:
                valid_x, valid_y = valid_x.to(device), valid_y.to(device)
            accuracy = (model(valid_x).argmax(1) == valid_y).float().mean().item()
        print(f"validation accuracy {accuracy:.3f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
