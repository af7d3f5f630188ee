"""autocomp with Hugging Face accelerate: wrap the DDP model ``accelerator.prepare`` returns.

Run with two CPU processes (``accelerate launch --num_processes 2`` works the same way):

    torchrun --standalone --nproc_per_node 2 examples/frameworks/accelerate_train.py

In a multi-process run ``accelerator.prepare(model)`` returns a ``DistributedDataParallel``;
``autocomp.wrap`` registers the hook on it. accelerate's own ``comm_hook`` setting
(``DistributedDataParallelKwargs``) only takes its built-in hooks, and must stay unset: DDP
allows one hook. ``accelerator.accumulate`` skips the all-reduce with ``no_sync`` on the
accumulation steps, so the hook runs once per optimizer step.
"""

from __future__ import annotations

import argparse
import gc
import logging
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import autocomp

logger = logging.getLogger(__name__)

PLAN = {"*.bias": "none", "*": "int8"}


def teacher_data(samples: int = 1024) -> TensorDataset:
    """A learnable task with no download: labels from a fixed random linear teacher."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 16, generator=gen)
    y = (x @ torch.randn(16, 5, generator=gen)).argmax(dim=1)
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=32, help="batches per rank")
    parser.add_argument("--accumulate", type=int, default=2, help="batches per optimizer step")
    parser.add_argument("--checkpoint", type=Path, help="save and restore a checkpoint here")
    parser.add_argument("--out", type=Path, help="write each rank's results here (tests)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    set_seed(0)
    model = nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(teacher_data(), batch_size=16, shuffle=True)
    ddp, opt, loader = accelerator.prepare(model, opt, loader)
    ctl = autocomp.wrap(ddp, plan=PLAN)  # ddp is a DistributedDataParallel

    losses: list[float] = []
    optimizer_steps = 0
    for i, (x, y) in enumerate(loader):
        if i == args.batches:
            break
        with accelerator.accumulate(ddp):
            loss = nn.functional.cross_entropy(ddp(x), y)
            accelerator.backward(loss)
            opt.step()  # a no-op on accumulation steps
            opt.zero_grad()
        optimizer_steps += int(accelerator.sync_gradients)
        ctl.observe_loss(loss.detach())
        losses.append(float(loss.detach()))
    if accelerator.is_main_process:
        logger.info("%s", ctl.summary())

    # Checkpoint: accelerate saves the model, optimizer and RNG states; autocomp's state is
    # per rank (error feedback), so each rank writes its own file next to them.
    saved = restored = None
    if args.checkpoint is not None:
        rank = accelerator.process_index
        accelerator.save_state(str(args.checkpoint))
        saved = ctl.state_dict()
        torch.save(saved, args.checkpoint / f"autocomp-rank{rank}.pt")
        accelerator.wait_for_everyone()
        accelerator.load_state(str(args.checkpoint))
        ctl.load_state_dict(torch.load(args.checkpoint / f"autocomp-rank{rank}.pt"))
        restored = ctl.state_dict()

    result = {
        "rank": accelerator.process_index,
        "wrapped_type": type(ddp).__name__,
        "batches": len(losses),
        "optimizer_steps": optimizer_steps,
        "controller_step": ctl.step,
        "plan": ctl.plan,
        "stats": ctl.stats(),
        "losses": losses,
        "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
        "saved": saved,
        "restored": restored,
    }
    ctl.close()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(result, args.out / f"rank{accelerator.process_index}.pt")
    # Free the DDP model (and the futures its reducer keeps) while the process group is still
    # alive: left to interpreter exit, gloo aborted a rank now and then ("terminate called
    # without an active exception") after the work was done.
    del ddp, model, opt, loader, ctl, result
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
