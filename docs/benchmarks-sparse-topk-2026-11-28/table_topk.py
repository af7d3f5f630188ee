"""The ngram task's table gradient, one rank, 30 steps: its nonzero share, and what top-1%
with error feedback leaves behind (run from the repository root with the project's venv)."""

import torch

from autocomp_bench.tasks import build_task

torch.set_num_threads(1)
task = build_task("ngram")
torch.manual_seed(0)
model = task.build_model()
opt = task.make_optimizer(model.parameters())
residual = torch.zeros(model.table.weight.shape).reshape(-1)
for step in range(30):
    x, y = task.batch(0, step, 0)
    opt.zero_grad()
    task.loss(model(x), y).backward()
    grad = model.table.weight.grad.reshape(-1)
    work = grad + residual
    k = int(0.01 * work.numel())
    index = work.abs().topk(k).indices
    sent = torch.zeros_like(work)
    sent[index] = work[index]
    residual = work - sent
    if step % 5 == 0 or step == 29:
        nonzero = int((grad != 0).sum())
        error = float(residual.norm() / work.norm())
        print(f"step {step}: {nonzero / grad.numel():.4%} nonzero, top-1% EF error {error:.3f}")
    opt.step()
