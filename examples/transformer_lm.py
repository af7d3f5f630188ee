"""Train a small causal transformer LM on the Python standard library's source with plain DDP.

    torchrun --nproc_per_node 2 examples/transformer_lm.py --steps 200
    autocomp-advisor profile examples/transformer_lm.py --steps 10      # profile it as it is

A byte-level model (vocabulary of 256): token and learned position embeddings, an
``nn.TransformerEncoder`` run with a causal mask (so it is a decoder-only LM), a final
LayerNorm and a linear head; every position predicts the next byte. The corpus is the
standard library's own ``.py`` files (``autocomp_bench.workloads.text_split``), so nothing is
downloaded. Runs on CPU (gloo) or GPU (NCCL, one process per GPU); no autocomp needed.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from autocomp_bench.workloads import VOCAB_SIZE, text_split


class TransformerLM(nn.Module):
    """Decoder-only transformer over bytes: causal self-attention via an encoder stack."""

    def __init__(
        self, context: int, d_model: int, heads: int, layers: int, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(VOCAB_SIZE, d_model)
        self.position = nn.Parameter(torch.zeros(context, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model,
            heads,
            dim_feedforward=4 * d_model,
            dropout=dropout,
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB_SIZE)
        nn.init.normal_(self.position, std=0.02)
        mask = nn.Transformer.generate_square_subsequent_mask(context)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        h = self.embed(tokens) * math.sqrt(self.embed.embedding_dim) + self.position[:length]
        mask = self.causal_mask[:length, :length]
        h = self.encoder(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


def batch(data: torch.Tensor, context: int, size: int, rank: int, step: int) -> torch.Tensor:
    """``size`` windows of ``context + 1`` bytes, a pure function of (rank, step)."""
    gen = torch.Generator().manual_seed(rank * 7919 + step)
    starts = torch.randint(0, len(data) - context - 1, (size,), generator=gen)
    return data[starts[:, None] + torch.arange(context + 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    parser.add_argument("--context", type=int, default=128, help="bytes per sequence")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--log-every", type=int, default=20)
    args = parser.parse_args(argv)

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else None
    if device is not None:
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # identical initial weights on every rank
    model = TransformerLM(args.context, args.d_model, args.heads, args.layers)
    model = model.to(device or "cpu")
    ddp = DDP(model, device_ids=[device] if device is not None else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)
    split = text_split()
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"{params / 1e6:.2f}M parameters, {len(split.train) / 1e6:.1f} MB of text")

    for step in range(args.steps):
        window = batch(split.train, args.context, args.batch, rank, step)
        if device is not None:
            window = window.to(device)
        logits = ddp(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), window[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            bits = loss.item() / math.log(2)
            print(f"step {step:4d} loss {loss.item():.3f} ({bits:.2f} bits/byte)", flush=True)

    if rank == 0:
        # The bare module, not ddp: a DDP forward on one rank alone would wait for the others
        # (DDP broadcasts buffers, here the causal mask, from rank 0 at every forward).
        model.eval()
        with torch.no_grad():
            window = batch(split.valid, args.context, 32, 0, 0)
            if device is not None:
                window = window.to(device)
            logits = model(window[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), window[:, 1:].reshape(-1))
        print(f"validation loss {loss.item():.3f} ({loss.item() / math.log(2):.2f} bits/byte)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
