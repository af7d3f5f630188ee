"""A user's LSTM LM script: plain DDP, nothing autocomp-specific."""
import os
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(256, 64)
            self.lstm = nn.LSTM(64, 256, num_layers=2, batch_first=True)
            self.head = nn.Linear(256, 256)
        def forward(self, x):
            return self.head(self.lstm(self.embed(x))[0])
    model = DDP(LM())
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(rank)
    for step in range(10_000):
        x = torch.randint(0, 256, (16, 65), generator=g)
        out = model(x[:, :-1])
        loss = F.cross_entropy(out.reshape(-1, 256), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

if __name__ == "__main__":
    main()
