"""Per layer, along training with the 2-rank averaged gradient (AdamW as the task trains): the
gradient's signal share |E g|^2 / E|g_avg|^2, estimated from the two ranks' local gradients and
their mean, pooled over steps 40-130 (sums of the estimator's terms, then the ratio), and the
layer's share of the gradient's L1 norm. A layer whose averaged gradient is mostly minibatch
noise loses less progress to a compression error of the same relative size (hypothesis)."""
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
    acc = {n: [0.0, 0.0, 0.0] for n, _ in named}  # sum local^2 mean, sum avg^2, sum L1 of avg
    for step in range(131):
        grads = []
        for rank in range(2):
            x, y = task.batch(rank, step, 0)
            model.zero_grad(); task.loss(model(x), y).backward()
            grads.append([p.grad.detach().clone() for _, p in named])
        avg = [(a + b) / 2 for a, b in zip(*grads)]
        if step >= 40:
            for (n, _), a, b, g in zip(named, *grads, avg):
                acc[n][0] += float((a * a).sum() + (b * b).sum()) / 2
                acc[n][1] += float((g * g).sum())
                acc[n][2] += float(g.abs().sum())
        for (_, p), g in zip(named, avg): p.grad = g
        opt.step()
    total_l1 = sum(v[2] for n, v in acc.items() if dict(named)[n].dim() >= 2)
    rows = {}
    for n, (loc, av, l1) in acc.items():
        if dict(named)[n].dim() < 2: continue
        noise_avg = loc - av          # E|g_i|^2 - E|g_avg|^2 = S/2 (per-rank noise S, W=2)
        signal = av - noise_avg       # |G|^2 = E|g_avg|^2 - S/(2*... ) with W=2: S/2
        rows[n] = {"signal_share": signal / av if av > 0 else 0.0, "l1_share": l1 / total_l1}
    out[name] = rows
    print(name)
    for n, r in rows.items():
        if n in ("embed.weight", "position", "head.weight") or n.startswith(("blocks.0.", "blocks.5.", "blocks.11.", "blocks.1.")):
            print(f"  {n:34s} signal share {r['signal_share']:+.3f}  L1 share {r['l1_share']:.3f}")
    w = sum(r["l1_share"] * max(r["signal_share"], 0) for r in rows.values())
    print(f"  L1-weighted signal share, all matrices: {w:.3f}")
json.dump(out, open(sys.argv[0].replace(".py", ".json"), "w"), indent=1)
