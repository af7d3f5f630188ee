"""Gradient readings along training, per model, for the per-model price of error (thirtieth
session). Every mode trains the task's model from seed 0 with its own optimizer on the 2-rank
averaged gradient (both ranks' batches computed in one process), 131 steps, and writes
<mode>.json beside this script. From the repository root:

  python docs/benchmarks-as-is-2026-11-29/gradient_study.py MODE TASK [TASK ...]

Modes:
  noise        noise-to-signal of the averaged gradient, whole model, at a few steps;
  layer-noise  per matrix, the signal share |E g|^2 / E|g_avg|^2 pooled over steps 40-130;
  temporal     per matrix, cos(g_t, g_t-1) of the averaged gradient, steps 40-130;
  inuse        rank 4 with error feedback on every matrix, the averaged update's relative
               error per matrix (exactly the mean of the 2-rank system: every step is linear
               in the ranks' gradients given the shared basis), steps 40-130.
The held-out 12-layer GPT is task gpt-deep (registered from docs/benchmarks-heldout-gpt12-2026-11-26).
"""
import json, os, sys
import torch
import autocomp_bench.tasks as T
from autocomp.compressors import build_compressor, run_rounds_locally

sys.path.insert(0, "docs/benchmarks-heldout-gpt12-2026-11-26")
import sitecustomize  # noqa: E402,F401  (registers gpt-deep)

STEPS = 131
FROM = 40


def train(name, on_step, transform=None):
    """Train ``name``; ``on_step(step, named, grads_per_rank, avg)`` reads each step,
    ``transform(step, index, name, param, avg_grad)`` may replace the gradient the optimizer
    gets."""
    task = T.build_task(name)
    torch.manual_seed(0)
    model = task.build_model()
    opt = task.make_optimizer(model.parameters())
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for step in range(STEPS):
        grads = []
        for rank in range(2):
            x, y = task.batch(rank, step, 0)
            model.zero_grad()
            task.loss(model(x), y).backward()
            grads.append([p.grad.detach().clone() for _, p in named])
        avg = [(a + b) / 2 for a, b in zip(*grads)]
        on_step(step, named, grads, avg)
        for index, ((n, p), g) in enumerate(zip(named, avg)):
            p.grad = g if transform is None else transform(step, index, n, p, g)
        opt.step()
    return task, model


def noise(name):
    rows = []

    def read(step, named, grads, avg):
        if step in (5, 20, 40, 70, 100, 130):
            local = sum(float(sum((g * g).sum() for g in gr)) for gr in grads) / 2
            mean = float(sum((g * g).sum() for g in avg))
            per_rank = 2 * (local - mean)  # E|g_i|^2 - E|g_avg|^2 = S/2 with 2 ranks
            signal = mean - per_rank / 2
            rows.append({"step": step, "local2": local, "avg2": mean,
                         "noise_over_signal": (per_rank / 2) / signal if signal > 0 else float("inf")})

    train(name, read)
    print(name, [round(r["noise_over_signal"], 2) for r in rows])
    return rows


def layer_noise(name):
    sums = {}

    def read(step, named, grads, avg):
        if step < FROM:
            return
        for (n, p), a, b, g in zip(named, *grads, avg):
            if p.dim() >= 2:
                acc = sums.setdefault(n, [0.0, 0.0, 0.0])
                acc[0] += float((a * a).sum() + (b * b).sum()) / 2
                acc[1] += float((g * g).sum())
                acc[2] += float(g.abs().sum())

    train(name, read)
    total = sum(v[2] for v in sums.values())
    rows = {n: {"signal_share": (2 * av - loc) / av if av > 0 else 0.0, "l1_share": l1 / total}
            for n, (loc, av, l1) in sums.items()}
    weighted = sum(r["l1_share"] * max(r["signal_share"], 0.0) for r in rows.values())
    print(name, f"L1-weighted signal share {weighted:.3f}; embedding",
          {k: round(v, 3) for k, v in rows.get("embed.weight", {}).items()})
    return rows


def temporal(name):
    cos, l1, prev = {}, {}, [None]

    def read(step, named, grads, avg):
        if prev[0] is not None and step >= FROM:
            for (n, p), g, h in zip(named, avg, prev[0]):
                if p.dim() >= 2:
                    cos.setdefault(n, []).append(
                        float(torch.nn.functional.cosine_similarity(g.flatten(), h.flatten(), dim=0)))
                    l1[n] = l1.get(n, 0.0) + float(g.abs().sum())
        prev[0] = avg

    train(name, read)
    total = sum(l1.values())
    mean = {n: sum(v) / len(v) for n, v in cos.items()}
    weighted = sum(mean[n] * l1[n] / total for n in mean)
    print(name, f"L1-weighted mean cos(g_t, g_t-1) {weighted:.3f}")
    return {"per_layer": mean, "l1_share": {n: l1[n] / total for n in mean}, "weighted": weighted}


def inuse(name):
    c = build_compressor("powersgd:rank=4")
    states, residual, err2, l1 = {}, {}, {}, {}

    def compress(step, index, n, p, g):
        if not c.compresses(p.shape) or step < 2:  # 1-D sent whole; 2 uncompressed steps
            return g
        if n not in states:
            states[n] = c.init_state(p.shape, index, 0)
            residual[n] = torch.zeros_like(g)
        x = g + residual[n]
        payload = run_rounds_locally(c, x, states[n])
        estimate = c.decompress(payload, x.shape, states[n])
        c.commit(payload, states[n])
        residual[n] = x - estimate
        if step >= FROM:
            err2[n] = err2.get(n, 0.0) + float((residual[n].norm() / x.norm()) ** 2)
            l1[n] = l1.get(n, 0.0) + float(g.abs().sum())
        return estimate

    task, model = train(name, lambda *a: None, compress)
    total = sum(l1.values())
    count = STEPS - FROM
    mean_e2 = sum(err2[n] / count * l1[n] / total for n in err2)
    print(name, f"L1-weighted mean e^2 of the average {mean_e2:.3f}")
    return {"weighted_mean_e2": mean_e2, "predicted_value": 1 - 0.2 * mean_e2,
            "e": {n: (err2[n] / count) ** 0.5 for n in err2},
            "l1_share": {n: l1[n] / total for n in err2}, "valid": task.evaluate(model)}


MODES = {"noise": noise, "layer-noise": layer_noise, "temporal": temporal, "inuse": inuse}

if __name__ == "__main__":
    torch.set_num_threads(2)
    mode, tasks = sys.argv[1], sys.argv[2:]
    out = {name: MODES[mode](name) for name in tasks}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), mode.replace("-", "_") + ".json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
