"""Gradient noise-to-signal of the 2-rank averaged gradient, per model, along training."""
import json, sys, torch
import autocomp_bench.tasks as T
sys.path.insert(0, "docs/benchmarks-heldout-gpt12-2026-11-26"); import sitecustomize  # noqa
torch.set_num_threads(2)
out = {}
for name in sys.argv[1:]:
    task = T.build_task(name)
    torch.manual_seed(0)
    model = task.build_model(); opt = task.make_optimizer(model.parameters())
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for step in range(131):
        grads = []
        for rank in range(2):
            x, y = task.batch(rank, step, 0)
            model.zero_grad(); task.loss(model(x), y).backward()
            grads.append([p.grad.detach().clone() for p in params])
        avg = [(a + b) / 2 for a, b in zip(*grads)]
        if step in (5, 20, 40, 70, 100, 130):
            loc = sum(float(sum((g * g).sum() for g in gr)) for gr in grads) / 2
            av = float(sum((g * g).sum() for g in avg))
            s = 2 * (loc - av); G2 = av - s / 2
            rows.append({"step": step, "local2": loc, "avg2": av, "noise_over_signal": (s / 2) / G2 if G2 > 0 else float("inf"),
                         "valid": task.evaluate(model)["valid_loss"]})
            print(name, rows[-1], flush=True)
        for p, g in zip(params, avg): p.grad = g
        opt.step()
    out[name] = rows
json.dump(out, open(sys.argv[0].replace(".py", ".json"), "w"), indent=1)
