import torch, autocomp_bench.tasks as T
torch.manual_seed(0); torch.set_num_threads(1)
task = T.get_task("mlp-lm") if hasattr(T, "get_task") else T._build("mlp-lm")
m = task.build_model(); opt = task.make_optimizer(m.parameters())
for step in range(401):
    x, y = task.batch(0, step, 0)
    opt.zero_grad(); loss = task.loss(m(x), y); loss.backward()
    if step in (50, 150, 300, 400):
        l1 = {n: float(p.grad.abs().sum()) for n, p in m.named_parameters() if p.dim() > 1}
        l2 = {n: float(p.grad.norm()) * p.numel() ** 0.5 for n, p in m.named_parameters() if p.dim() > 1}
        num = {n: p.numel() for n, p in m.named_parameters() if p.dim() > 1}
        for name, d in (("l1", l1), ("sqrtn*l2", l2), ("numel", num)):
            t = sum(d.values()); print(step, name, {k: round(v / t, 3) for k, v in d.items()})
    opt.step()
