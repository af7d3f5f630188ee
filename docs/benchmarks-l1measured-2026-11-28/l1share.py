# Per-layer gradient L1 norm vs the sqrt(numel)*||g||_2 estimate on the gpt task (1 process, uncompressed AdamW).
import math, sys, torch
from autocomp_bench.tasks import build_task
torch.set_num_threads(1)
name = sys.argv[1] if len(sys.argv) > 1 else "gpt"
task = build_task(name)
torch.manual_seed(0)
model = task.build_model()
opt = task.make_optimizer(model.parameters())
watch = {}
for step in range(151):
    x, y = task.batch(0, step, 0)
    loss = task.loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if step in (5, 20, 50, 100, 150):
        rows = []
        for n, p in model.named_parameters():
            if p.grad is None or p.dim() < 2: continue
            g = p.grad.float()
            rows.append((n, g.numel(), g.abs().sum().item(), math.sqrt(g.numel()) * g.norm().item(), (g != 0).float().mean().item()))
        L1 = sum(r[2] for r in rows); EST = sum(r[3] for r in rows); N = sum(r[1] for r in rows)
        print(f"step {step}")
        for n, numel, l1, est, nz in rows:
            print(f"  {n:32s} numel {numel/N:6.1%}  L1 {l1/L1:6.1%}  est {est/EST:6.1%}  ratio L1/est {l1/est:.2f} nz {nz:.2f}")
    opt.step()
