"""autocomp with the Hugging Face Trainer, through a TrainerCallback.

Run with two CPU processes (a tiny GPT-2 built from its config, no download):

    torchrun --standalone --nproc_per_node 2 examples/frameworks/hf_trainer.py

The Trainer builds its DDP model inside ``train()`` (``accelerator.prepare``), after
``__init__`` and before ``on_train_begin``; callbacks receive the unwrapped model, but the
Trainer keeps the DDP model in its documented ``model_wrapped`` attribute. So the callback
holds the Trainer and wraps ``trainer.model_wrapped`` at ``on_train_begin``, on every rank,
before the first backward. The Trainer has no comm-hook setting of its own.
"""

from __future__ import annotations

import argparse
import gc
import logging
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

import autocomp

logger = logging.getLogger(__name__)

PLAN = {"*.bias": "none", "*": "topk:ratio=0.1"}


class AutocompCallback(TrainerCallback):
    """Wraps ``trainer.model_wrapped`` (the DDP model) at ``on_train_begin``.

    In a single-process run there is no DDP model and nothing to compress; the callback then
    leaves ``controller`` None.
    """

    def __init__(self, trainer: Trainer, config: autocomp.AutocompConfig | None = None) -> None:
        self.trainer = trainer
        self.config = config or autocomp.AutocompConfig()
        self.controller: autocomp.Controller | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        ddp = self.trainer.model_wrapped
        if not isinstance(ddp, DistributedDataParallel):
            logger.warning("autocomp: the Trainer did not build a DDP model; nothing to wrap")
            return
        if self.controller is None or self.controller.model is not ddp:
            self.controller = autocomp.wrap(ddp, config=self.config)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        # The Trainer hands callbacks the loss only as logged (every logging_steps).
        if self.controller is not None and logs and "loss" in logs:
            self.controller.observe_loss(float(logs["loss"]))


class CountingSequences(Dataset):
    """Token sequences that count up modulo the vocabulary from a random start: learnable."""

    def __init__(self, samples: int = 512, length: int = 16, vocab: int = 64) -> None:
        gen = torch.Generator().manual_seed(1234)
        starts = torch.randint(0, vocab, (samples, 1), generator=gen)
        self.tokens = (starts + torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-steps", type=int, default=30, help="optimizer steps")
    parser.add_argument("--accumulate", type=int, default=2, help="batches per optimizer step")
    parser.add_argument("--output-dir", type=Path, default=Path("hf-trainer-output"))
    parser.add_argument("--out", type=Path, help="write each rank's results here (tests)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    training_args = TrainingArguments(
        output_dir=str(args.output_dir),
        use_cpu=True,
        ddp_backend="gloo",
        max_steps=args.max_steps,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=args.accumulate,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=CountingSequences())
    callback = AutocompCallback(trainer, autocomp.AutocompConfig(plan=PLAN))
    trainer.add_callback(callback)
    trainer.train()

    ctl = callback.controller
    assert ctl is not None
    rank = trainer.args.process_index
    if rank == 0:
        logger.info("%s", ctl.summary())
    result = {
        "rank": rank,
        "wrapped_type": type(trainer.model_wrapped).__name__,
        "global_step": trainer.state.global_step,
        "controller_step": ctl.step,
        "plan": ctl.plan,
        "stats": ctl.stats(),
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
    }
    ctl.close()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(result, args.out / f"rank{rank}.pt")

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
