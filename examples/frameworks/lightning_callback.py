"""autocomp in PyTorch Lightning through a Callback that wraps the strategy's DDP model.

Run with two CPU processes (or ``devices=N`` GPUs):

    torchrun --standalone --nproc_per_node 2 examples/frameworks/lightning_callback.py

``DDPStrategy`` builds the DDP model in ``strategy.setup``, after the callbacks' ``setup`` and
before ``on_fit_start``; :class:`AutocompCallback` wraps it there with ``autocomp.wrap``, on
every rank, before the first backward. This works on CPU and CUDA alike (the strategy's
comm-hook slot is CUDA-only, see ``lightning_strategy.py``).
"""

from __future__ import annotations

import argparse
import gc
import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import autocomp

logger = logging.getLogger(__name__)


class AutocompCallback(L.Callback):
    """Wraps the strategy's DDP model at ``on_fit_start``; feeds the loss to the guards.

    ``controller`` is the :class:`autocomp.Controller` of the current ``fit`` (a new one for
    each ``fit``: Lightning builds a new DDP model each time).
    """

    def __init__(self, config: autocomp.AutocompConfig | None = None) -> None:
        self.config = config or autocomp.AutocompConfig()
        self.controller: autocomp.Controller | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ddp = trainer.strategy.model
        if not isinstance(ddp, DistributedDataParallel):
            raise TypeError(
                f"AutocompCallback needs a DDP strategy; {type(trainer.strategy).__name__} "
                f"gave a {type(ddp).__name__}"
            )
        self.controller = autocomp.wrap(ddp, config=self.config)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        if self.controller is not None and isinstance(outputs, dict) and "loss" in outputs:
            self.controller.observe_loss(outputs["loss"])  # a tensor: no host sync


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-steps", type=int, default=40, help="optimizer steps")
    parser.add_argument("--accumulate", type=int, default=2, help="batches per optimizer step")
    parser.add_argument("--window", type=int, default=4, help="steps between decisions")
    parser.add_argument(
        "--quiet-seconds",
        type=float,
        default=2.0,
        help="quiet stretch of an uncompressed plan (0: a boundary every window)",
    )
    parser.add_argument("--out", type=Path, help="write each rank's results here (tests)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    L.seed_everything(0, verbose=False)
    callback = AutocompCallback(
        autocomp.AutocompConfig(
            target_overlap=0.9,
            window=args.window,
            warmup_steps=4,
            quiet_window_seconds=args.quiet_seconds,
        )
    )
    model = Classifier()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=args.max_steps,
        accumulate_grad_batches=args.accumulate,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(teacher_data(), batch_size=32, shuffle=True))
    ctl = callback.controller
    assert ctl is not None
    if trainer.global_rank == 0:
        logger.info("%s", ctl.summary())
    result = {
        "rank": trainer.global_rank,
        "global_step": trainer.global_step,
        "controller_step": ctl.step,
        "mode": ctl.mode,
        "history_steps": [record.step for record in ctl.history],
        "summary": ctl.summary(),
        "stats": ctl.stats(),
        "losses": model.losses,
        "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
    }
    ctl.close()  # a collective: every rank, between the same two steps
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(result, args.out / f"rank{trainer.global_rank}.pt")

    # Free the DDP model (and the futures its reducer keeps) while the process group is still
    # alive, then stop gloo's worker threads before the interpreter does: left to exit, gloo
    # aborted a rank now and then after the work was done ("terminate called without an
    # active exception", exit -6).
    del trainer, callback, model, ctl, result
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
