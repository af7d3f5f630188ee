"""Per model: how alike a layer's averaged gradient is from one step to the next (cosine of
g_t and g_{t-1}, 2-rank average, each task's own optimizer), L1-weighted over the matrices,
steps 40-130. Error feedback delivers a dropped part of the gradient later; that costs less
where the gradient keeps its direction (hypothesis for the per-model price of error).
From the repository root: python docs/benchmarks-as-is-2026-11-29/temporal.py gpt gpt-deep mlp-lm lstm-lm cnn"""
import json, sys, torch
import autocomp_bench.tasks as T
sys.path.insert(0, "docs/benchmarks-heldout-gpt12-2026-11-26"); import sitecustomize  # noqa
torch.set_num_threads(2)
out = {}
for name in sys.argv[1:]:
    task = T.build_task(name)
    torch.manual_seed(0)
    model = task.build_model(); opt = task.make_optimizer(model.parameters())
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    prev = None
    cos = {n: [] for n, p in named if p.dim() >= 2}
    l1 = {n: 0.0 for n in cos}
    for step in range(131):
        grads = []
        for rank in range(2):
            x, y = task.batch(rank, step, 0)
            model.zero_grad(); task.loss(model(x), y).backward()
            grads.append([p.grad.detach().clone() for _, p in named])
        avg = [(a + b) / 2 for a, b in zip(*grads)]
        if prev is not None and step >= 40:
            for (n, p), g, h in zip(named, avg, prev):
                if n in cos:
                    cos[n].append(float(torch.nn.functional.cosine_similarity(g.flatten(), h.flatten(), dim=0)))
                    l1[n] += float(g.abs().sum())
        prev = avg
        for (_, p), g in zip(named, avg): p.grad = g
        opt.step()
    total = sum(l1.values())
    mean = {n: sum(v) / len(v) for n, v in cos.items()}
    weighted = sum(mean[n] * l1[n] / total for n in cos)
    out[name] = {"per_layer": mean, "l1_share": {n: l1[n] / total for n in cos}, "weighted": weighted}
    print(name, f"L1-weighted mean cos(g_t, g_t-1) = {weighted:.3f};",
          "embed", f"{mean.get('embed.weight', float('nan')):.3f}", "position", f"{mean.get('position', float('nan')):.3f}",
          "median over matrices", f"{sorted(mean.values())[len(mean) // 2]:.3f}")
json.dump(out, open(sys.argv[0].replace(".py", ".json"), "w"), indent=1)
