"""Rank 4's error in use, per model: train with PowerSGD rank 4 and error feedback on every
matrix (the 2-rank averaged gradient compressed in one process, one residual; 1-D tensors
sent whole), and read each matrix's relative error ||x - C(x)|| / ||x|| (x = gradient +
residual) and the L1 norm of its gradient, steps 40-130. Then 1 - 0.2 x the L1-weighted mean
e^2: what the engine's error model predicts from errors measured in use, not from priors.
The one-process compression of the averaged gradient is exactly the mean of the 2-rank
system: P, Q and the error feedback are linear in the ranks' gradients given the shared basis.
From the repository root: python docs/benchmarks-as-is-2026-11-29/inuse.py gpt gpt-deep mlp-lm lstm-lm cnn"""
import json, sys, torch
import autocomp_bench.tasks as T
from autocomp.compressors import build_compressor, run_rounds_locally
sys.path.insert(0, "docs/benchmarks-heldout-gpt12-2026-11-26"); import sitecustomize  # noqa
torch.set_num_threads(2)
out = {}
for name in sys.argv[1:]:
    task = T.build_task(name)
    torch.manual_seed(0)
    model = task.build_model(); opt = task.make_optimizer(model.parameters())
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    c = build_compressor("powersgd:rank=4")
    states = {n: c.init_state(p.shape, i, 0) for i, (n, p) in enumerate(named)}
    residual = {n: torch.zeros_like(p) for n, p in named}
    err2 = {n: 0.0 for n, p in named if c.compresses(p.shape)}
    l1 = {n: 0.0 for n in err2}
    for step in range(131):
        grads = []
        for rank in range(2):
            x, y = task.batch(rank, step, 0)
            model.zero_grad(); task.loss(model(x), y).backward()
            grads.append([p.grad.detach().clone() for _, p in named])
        for (n, p), a, b in zip(named, *grads):
            g = (a + b) / 2
            if n not in err2 or step < 2:   # warm-up steps uncompressed, as the hook's plans
                p.grad = g
                continue
            x = g + residual[n]
            payload = run_rounds_locally(c, x, states[n])
            est = c.decompress(payload, x.shape, states[n])
            c.commit(payload, states[n])
            residual[n] = x - est
            if step >= 40:
                err2[n] += float((residual[n].norm() / x.norm()) ** 2)
                l1[n] += float(g.abs().sum())
            p.grad = est
        opt.step()
    total = sum(l1.values())
    mean_e2 = sum(err2[n] / 91 * l1[n] / total for n in err2)
    out[name] = {"weighted_mean_e2": mean_e2, "predicted_value": 1 - 0.2 * mean_e2,
                 "e": {n: (err2[n] / 91) ** 0.5 for n in err2}, "l1_share": {n: l1[n] / total for n in err2},
                 "valid": task.evaluate(model)}
    print(f"{name}: L1-weighted mean e^2 in use {mean_e2:.3f} -> 1 - 0.2 E = {1 - 0.2 * mean_e2:.3f}; "
          f"valid {out[name]['valid']}", flush=True)
json.dump(out, open(sys.argv[0].replace(".py", ".json"), "w"), indent=1)
