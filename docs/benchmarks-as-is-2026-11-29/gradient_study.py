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
               in the ranks' gradients given the shared basis), steps 40-130;
  ranks        rank 4 as the hook runs it on two ranks: the hook's per-rank error reading,
               the averaged update's error, and a count-sketch estimate of the latter.
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


def count_sketch(x, k, seed):
    """A k-bucket count sketch of ``x`` (hash and signs from ``seed``, alike on every rank):
    linear, so the ranks' sketches sum to the sketch of their sum, and its squared norm
    estimates ||x||^2 (relative spread about sqrt(2 / k))."""
    g = torch.Generator().manual_seed(seed)
    n = x.numel()
    bucket = torch.randint(0, k, (n,), generator=g)
    sign = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
    return torch.zeros(k).index_add_(0, bucket, sign * x.flatten())


def ranks(name, sketch_sizes=(64, 256)):
    """Rank 4 as the hook runs it on two ranks: each rank's gradient pre-divided by 2 plus its
    own residual, P summed, Q local then summed, each rank's residual (I - P P^T) x_i, the
    summed estimate to the optimizer. Per matrix, steps 40-130, the L1-weighted mean e^2 of:
    the hook's reading (each rank's residual against its own x_i, averaged over ranks); the
    averaged update's (the summed residual against the summed x); and the count-sketch
    estimate of the latter, S / (S + ||Q_sum||^2) with S the summed residual sketch's squared
    norm (||sum x||^2 = ||P^T sum x||^2 + ||sum r||^2)."""
    c = build_compressor("powersgd:rank=4")
    states, residual, l1 = {}, {}, {}
    sums = {"hook": {}, "average": {}, **{f"sketch{k}": {} for k in sketch_sizes}}
    step_grads = {}

    def keep(step, named, grads, avg):
        step_grads.clear()
        for (n, _), a, b in zip(named, *grads):
            step_grads[n] = (a, b)

    def compress(step, index, n, p, g):
        if not c.compresses(p.shape) or step < 2:
            return g
        if n not in states:
            states[n] = [c.init_state(p.shape, index, 0) for _ in range(2)]
            residual[n] = [torch.zeros_like(g) for _ in range(2)]
        xs = [gi / 2 + ri for gi, ri in zip(step_grads[n], residual[n])]
        p_sum = sum(c.compress(x, st) for x, st in zip(xs, states[n]))
        qs = [c.compress_round(x, 1, p_sum, st) for x, st in zip(xs, states[n])]
        q_sum = qs[0] + qs[1]
        estimate = c.decompress(q_sum, p.shape, states[n][0])
        x_norms = [float(x.norm()) for x in xs]
        x_sum_norm = float((xs[0] + xs[1]).norm())
        rs = [c.subtract_estimate_(x, q, st) for x, q, st in zip(xs, qs, states[n])]
        for st in states[n]:
            c.commit(q_sum, st)
        residual[n] = rs
        if step >= FROM:
            summed = rs[0] + rs[1]
            add = lambda key, v: sums[key].__setitem__(n, sums[key].get(n, 0.0) + v)
            add("hook", sum(float(r.norm()) ** 2 / xn**2 for r, xn in zip(rs, x_norms)) / 2)
            add("average", float(summed.norm()) ** 2 / x_sum_norm**2)
            q2 = float(q_sum.norm()) ** 2
            for k in sketch_sizes:
                sk = sum(count_sketch(r, k, 1000 * index + step) for r in rs)
                s2 = float(sk.norm()) ** 2
                add(f"sketch{k}", s2 / (s2 + q2))
            l1[n] = l1.get(n, 0.0) + float(g.abs().sum())
        return estimate

    train(name, keep, compress)
    total, count = sum(l1.values()), STEPS - FROM
    out = {key: sum(v[n] / count * l1[n] / total for n in v) for key, v in sums.items()}
    out["embed"] = {key: (v["embed.weight"] / count) ** 0.5 for key, v in sums.items()} if "embed.weight" in l1 else None
    print(name, {k: round(v, 3) for k, v in out.items() if k != "embed"}, "embedding e:",
          out["embed"] and {k: round(v, 3) for k, v in out["embed"].items()})
    return out


MODES = {"noise": noise, "layer-noise": layer_noise, "temporal": temporal, "inuse": inuse,
         "ranks": ranks}

if __name__ == "__main__":
    torch.set_num_threads(2)
    mode, tasks = sys.argv[1], sys.argv[2:]
    out = {name: MODES[mode](name) for name in tasks}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), mode.replace("-", "_") + ".json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
