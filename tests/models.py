"""Small models and data shared by the tests."""

from __future__ import annotations

import torch
from torch import nn


class MultiBucketNet(nn.Module):
    """An MLP whose gradients fill several DDP buckets at a small ``bucket_cap_mb``.

    Has 2-D weights (compressible), 1-D biases and a LayerNorm, an odd-sized layer, and a 4-D
    conv weight, so every compressor meets 0-d-free but varied shapes.
    """

    def __init__(self, width: int = 96, classes: int = 5) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(4 * 16, width)
        self.norm = nn.LayerNorm(width)
        self.fc2 = nn.Linear(width, width + 7)
        self.fc3 = nn.Linear(width + 7, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x.unsqueeze(1))).flatten(1)
        h = torch.relu(self.norm(self.fc1(h)))
        h = torch.relu(self.fc2(h))
        h = torch.relu(self.fc3(h))
        return self.head(h)


EVERY_COMPRESSOR_PLAN: dict[str, str] = {
    "conv.weight": "sign",
    "fc1.weight": "powersgd:rank=4",
    "fc1.bias": "fp16",
    "norm.weight": "bf16",
    "norm.bias": "none",
    "fc2.weight": "topk:ratio=0.1",
    "fc2.bias": "qsgd:levels=16",
    "fc3.weight": "int8",
    "fc3.bias": "randomk:ratio=0.5,unbiased=false",
    "head.*": "randomk:ratio=0.5",
}
"""Every compressor family on one :class:`MultiBucketNet`, one per parameter."""


def classification_batch(
    rank: int, step: int, batch: int = 32, features: int = 16, classes: int = 5
) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic, learnable batch: labels come from a fixed random linear teacher."""
    teacher = torch.Generator().manual_seed(1234)
    weights = torch.randn(features, classes, generator=teacher)
    gen = torch.Generator().manual_seed(10_000 * (rank + 1) + step)
    x = torch.randn(batch, features, generator=gen)
    return x, (x @ weights).argmax(dim=1)
