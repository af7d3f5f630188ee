"""autocomp in PyTorch Lightning through the strategy's comm-hook slot.

Run with two CPU processes (or ``devices=N`` GPUs):

    torchrun --standalone --nproc_per_node 2 examples/frameworks/lightning_strategy.py

``autocomp.make_hook`` gives a ``(state, hook)`` pair for ``DDPStrategy(ddp_comm_state=...,
ddp_comm_hook=...)``. Lightning 2.x registers that pair only when the root device is CUDA
(``DDPStrategy._register_ddp_hooks``) and silently skips it on CPU, so this script uses
:class:`AutocompDDPStrategy`, which registers the pair on the DDP model it builds on any
device. ``--strategy slot`` runs the plain slot instead, to see what Lightning does with it.
"""

from __future__ import annotations

import argparse
import gc
import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import autocomp

logger = logging.getLogger(__name__)

PLAN = {"*.bias": "none", "*": "powersgd:rank=2"}


class AutocompDDPStrategy(DDPStrategy):
    """``DDPStrategy`` whose DDP model always gets autocomp's hook, on CPU as on CUDA.

    The pair goes through Lightning's own slot; on a non-CUDA root device, where Lightning
    skips the slot, ``configure_ddp`` registers it on the DDP model it has just built.
    """

    def __init__(self, config: autocomp.AutocompConfig | None = None, **kwargs: Any) -> None:
        state, hook = autocomp.make_hook(config)
        super().__init__(ddp_comm_state=state, ddp_comm_hook=hook, **kwargs)
        self.autocomp_state = state
        self._autocomp_hook = hook

    def configure_ddp(self) -> None:
        super().configure_ddp()
        if self.root_device.type != "cuda":  # Lightning registered the slot on CUDA only
            self.model.register_comm_hook(self.autocomp_state, self._autocomp_hook)


class Classifier(L.LightningModule):
    """A small MLP; records every step's loss so the run can be checked."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5)
        )
        self.losses: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def teacher_data(samples: int = 1024) -> TensorDataset:
    """A learnable task with no download: labels from a fixed random linear teacher."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 16, generator=gen)
    y = (x @ torch.randn(16, 5, generator=gen)).argmax(dim=1)
    return TensorDataset(x, y)


def fit(kind: str, max_steps: int) -> dict[str, Any]:
    """One ``trainer.fit`` with the strategy ``kind`` (``autocomp`` or ``slot``)."""
    L.seed_everything(0, verbose=False)
    config = autocomp.AutocompConfig(plan=PLAN)
    if kind == "autocomp":
        strategy = AutocompDDPStrategy(config)
        state = strategy.autocomp_state
    else:  # the documented slot as is: effective on CUDA, skipped by Lightning on CPU
        state, hook = autocomp.make_hook(config)
        strategy = DDPStrategy(ddp_comm_state=state, ddp_comm_hook=hook)
    model = Classifier()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(teacher_data(), batch_size=32, shuffle=True))
    ctl = state.controller  # bound at the first backward (None if the hook never ran)
    if ctl is not None and trainer.global_rank == 0:
        logger.info("%s", ctl.summary())
    return {
        "rank": trainer.global_rank,
        "global_step": trainer.global_step,
        "bound": ctl is not None,
        "controller_step": None if ctl is None else ctl.step,
        "plan": None if ctl is None else ctl.plan,
        "stats": None if ctl is None else ctl.stats(),
        "losses": model.losses,
        "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", default="autocomp", help="autocomp, slot or slot,autocomp")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--out", type=Path, help="write each rank's results here (tests)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    results = {kind: fit(kind, args.max_steps) for kind in args.strategy.split(",")}
    if args.out is not None:
        rank = next(iter(results.values()))["rank"]
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(results, args.out / f"rank{rank}.pt")

    # Free the DDP model (and the futures its reducer keeps) while the process group is still
    # alive, then stop gloo's worker threads before the interpreter does: left to exit, gloo
    # aborted a rank now and then after the work was done ("terminate called without an
    # active exception", exit -6).
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
