"""Real training workloads that need no download: used by the demo, benchmarks and examples.

- A byte-level language model on the Python standard library's own source text, which every
  Python installation ships.
- A small CNN on scikit-learn's bundled 8x8 digits images.

Batches are a pure function of (rank, step), so runs are reproducible and each rank sees its
own shard, as in real data-parallel training.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

VOCAB_SIZE = 256  # bytes


@lru_cache(maxsize=4)
def stdlib_corpus(max_bytes: int = 4_000_000) -> torch.Tensor:
    """Bytes of the standard library's ``.py`` files (sorted, so identical on every rank)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total = 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if total < 100_000:
        raise RuntimeError(f"standard library source not found under {root}; cannot build corpus")
    corpus = b"".join(chunks)[:max_bytes]
    return torch.frombuffer(bytearray(corpus), dtype=torch.uint8).to(torch.long)


@dataclass(frozen=True, slots=True)
class TextSplit:
    """Train/validation split of the corpus (last 10% held out)."""

    train: torch.Tensor
    valid: torch.Tensor


def text_split(max_bytes: int = 4_000_000) -> TextSplit:
    corpus = stdlib_corpus(max_bytes)
    cut = int(len(corpus) * 0.9)
    return TextSplit(corpus[:cut], corpus[cut:])


def text_batch(
    data: torch.Tensor, context: int, batch: int, rank: int, step: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` windows of ``context`` bytes and the byte that follows each."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + step)
    starts = torch.randint(0, len(data) - context - 1, (batch,), generator=gen)
    offsets = torch.arange(context)
    return data[starts[:, None] + offsets], data[starts + context]


class MLPLanguageModel(nn.Module):
    """Byte-level MLP language model: embed a context window, two hidden layers, predict.

    Dense and matrix-heavy, so its gradient traffic is dominated by a few large matrices,
    the situation where per-layer compression matters.
    """

    def __init__(self, context: int = 32, embed: int = 64, hidden: int = 1024) -> None:
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(VOCAB_SIZE, embed)
        self.fc1 = nn.Linear(context * embed, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, VOCAB_SIZE)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens).flatten(1)
        h = torch.relu(self.fc1(h))
        h = self.norm(torch.relu(self.fc2(h)))
        return self.out(h)


@lru_cache(maxsize=1)
def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled digits: (train_x, train_y, valid_x, valid_y), 1x8x8 in [0, 1]."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    cut = int(len(x) * 0.8)
    return x[:cut], y[:cut], x[cut:], y[cut:]


def digits_batch(
    batch: int, rank: int, step: int, shift: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A training batch, a pure function of (rank, step). ``shift`` > 0 moves each image by
    a random whole-pixel offset in [-shift, shift] per axis (zero fill): 1,437 training
    images are a few hundred steps of data, and without it a model trained for thousands of
    steps only memorizes them (its validation loss rises again)."""
    train_x, train_y, _, _ = digits()
    gen = torch.Generator().manual_seed(rank * 7919 + step)
    index = torch.randint(0, len(train_x), (batch,), generator=gen)
    x, y = train_x[index], train_y[index]
    if shift > 0:
        size = x.shape[-1]
        padded = F.pad(x, (shift, shift, shift, shift))
        offsets = torch.randint(0, 2 * shift + 1, (batch, 2), generator=gen).tolist()
        x = torch.stack(
            [padded[i, :, dy : dy + size, dx : dx + size] for i, (dy, dx) in enumerate(offsets)]
        )
    return x, y


class DigitsCNN(nn.Module):
    """Two conv layers and a classifier for 8x8 digit images."""

    def __init__(self, channels: int = 32, hidden: int = 256) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.fc = nn.Linear(2 * channels * 4 * 4, hidden)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(x))
        h = torch.max_pool2d(torch.relu(self.conv2(h)), 2)
        return self.head(torch.relu(self.fc(h.flatten(1))))


class GPTLanguageModel(nn.Module):
    """A small GPT-style byte LM: tied input/output embeddings, ``nn.MultiheadAttention``.

    Pre-norm blocks (causal self-attention, then a 4x MLP), learned positions. The token
    embedding doubles as the output projection, so one parameter receives gradient from both
    ends of the network (a common pattern that per-layer compression must handle: its
    gradient is the sum of a sparse part from the input and a dense part from the head).
    """

    def __init__(
        self, context: int = 64, d_model: int = 128, heads: int = 4, layers: int = 2
    ) -> None:
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(VOCAB_SIZE, d_model)
        self.position = nn.Parameter(torch.zeros(context, d_model))
        self.blocks = nn.ModuleList(_GPTBlock(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.position, std=0.02)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        h = self.embed(tokens) + self.position[:length]
        mask = self.causal_mask[:length, :length]
        for block in self.blocks:
            h = block(h, mask)
        return self.norm(h) @ self.embed.weight.T


class _GPTBlock(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.norm1(h)
        h = h + self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]
        return h + self.mlp(self.norm2(h))


def sequence_batch(
    data: torch.Tensor, context: int, batch: int, rank: int, step: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` windows of ``context`` bytes and the same windows shifted by one (targets)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + step)
    starts = torch.randint(0, len(data) - context - 1, (batch,), generator=gen)
    windows = data[starts[:, None] + torch.arange(context + 1)]
    return windows[:, :-1], windows[:, 1:]


class HashedNgramModel(nn.Module):
    """Next-byte prediction from hashed byte n-grams: a large, sparsely touched embedding.

    Each of the last ``context`` bytes is combined with its predecessors into 1- to 3-grams,
    hashed into a ``buckets`` x ``dim`` table, summed and fed to a small MLP. Most rows of the
    table get no gradient on a given step, the case where dense compressors waste bytes and
    sparsifiers shine (recommendation and NLP models with large vocabularies look like this).
    """

    def __init__(self, context: int = 8, buckets: int = 1 << 15, dim: int = 64) -> None:
        super().__init__()
        self.context = context
        self.buckets = buckets
        self.table = nn.Embedding(buckets, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 256), nn.ReLU(), nn.Linear(256, VOCAB_SIZE))
        nn.init.normal_(self.table.weight, std=0.05)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = []
        prev2 = tokens[:, :-2] * 65_536 + tokens[:, 1:-1] * 256 + tokens[:, 2:]
        prev1 = tokens[:, 1:-1] * 256 + tokens[:, 2:]
        distance = torch.arange(tokens.shape[1], device=tokens.device)
        for order, grams in enumerate((tokens[:, 2:], prev1, prev2)):
            # Salt by order and distance from the predicted position: each (n-gram, position)
            # gets its own row, so the table is large and each step touches few rows.
            salt = (order + 1) * 1_000_003 + distance[2:].flip(0) * 7_919
            ids.append((grams * 2_654_435_761 + salt) % self.buckets)
        h = self.table(torch.cat(ids, dim=1)).sum(dim=1)
        return self.mlp(h)


class LSTMLanguageModel(nn.Module):
    """A byte-level LSTM LM: a few large recurrent matrices, each gradient summed over time.

    The recurrent weights' gradients add up contributions from every position of the window,
    a structure the transformer and MLP LMs do not have; ``nn.LSTM`` keeps each layer's four
    gates in one ``4 * hidden`` x ``input`` matrix.
    """

    def __init__(self, embed: int = 64, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB_SIZE, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, VOCAB_SIZE)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(tokens))[0])


class DigitsResNet(nn.Module):
    """Residual conv blocks with BatchNorm for the 8x8 digit images.

    BatchNorm's running statistics are buffers: DDP broadcasts them from rank 0 before every
    forward (``broadcast_buffers=True``), a collective of its own beside the gradients'.
    """

    def __init__(self, channels: int = 32, blocks: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU()
        )
        self.blocks = nn.ModuleList(_ResidualBlock(channels) for _ in range(blocks))
        self.head = nn.Linear(channels * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(torch.max_pool2d(h, 2).flatten(1))


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(channels)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.norm1(self.conv1(h)))
        return torch.relu(h + self.norm2(self.conv2(x)))


class DigitsViT(nn.Module):
    """A small vision transformer for the 8x8 digit images: 2x2 patches, a class token,
    pre-norm ``nn.TransformerEncoderLayer`` blocks.

    Its parameters are laid out as PyTorch's own encoder lays them out: each block's query,
    key and value projections are one packed ``in_proj_weight`` (3d x d), beside the output
    projection, two MLP matrices and four LayerNorm vectors; the patch projection is a
    4 x d matrix and the class token and positions are parameters of their own.
    """

    def __init__(self, d_model: int = 96, heads: int = 4, layers: int = 4, patch: int = 2) -> None:
        super().__init__()
        if patch < 1 or 8 % patch:
            raise ValueError(f"patch must divide the 8x8 image, got {patch}")
        self.patch = patch
        patches = (8 // patch) ** 2
        self.project = nn.Linear(patch * patch, d_model)
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model))
        self.position = nn.Parameter(torch.zeros(1, patches + 1, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model,
            heads,
            dim_feedforward=4 * d_model,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 10)
        nn.init.normal_(self.cls, std=0.02)
        nn.init.normal_(self.position, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch
        # (B, 1, 8, 8) -> (B, 16, 4): non-overlapping p x p patches, row-major.
        patches = x.unfold(2, p, p).unfold(3, p, p).reshape(x.shape[0], -1, p * p)
        h = self.project(patches)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], dim=1) + self.position
        return self.head(self.norm(self.encoder(h)[:, 0]))


class DigitsMLP(nn.Module):
    """A two-hidden-layer MLP classifier for the 8x8 digit images (flattened)."""

    def __init__(self, hidden: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
