"""How well one PowerSGD rank's measured error (averaged update, in use) predicts another
rank's on the same layer: the priors' multiplicative scaling (priors.rel_error) against a
power law e_layer(r) = e_prior(r) ** gamma, gamma from the measured rank.
    python rankfit.py ranks201.json"""
import json, math, sys
sys.path.insert(0, "/work/main")
import torch
from autocomp.policy.priors import ErrorPriors
from autocomp.compressors import build_compressor
from autocomp_bench.tasks import build_task
d = json.load(open(sys.argv[1]))
pri = ErrorPriors()
ranks = [4, 8, 16, 32]
shapes = {}
for task in ("lstm-lm", "gpt", "mlp-lm"):
    m = build_task(task).build_model()
    shapes[task] = {n: p.shape for n, p in m.named_parameters()}
rows = {"mult": [], "power": []}
detail = []
for task in ("lstm-lm", "gpt", "mlp-lm"):
    layers = d[f"{task} powersgd:rank=4"]["layers"]
    for name in layers:
        e = {r: math.sqrt(d[f"{task} powersgd:rank={r}"]["layers"][name]["avg_e2"]) for r in ranks}
        p = {r: pri.rel_error(build_compressor(f"powersgd:rank={r}"), shapes[task][name]) for r in ranks}
        for src in ranks:
            for dst in ranks:
                if src == dst or e[src] <= 0 or e[dst] <= 0:
                    continue
                mult = min(p[dst] * e[src] / p[src], max(1.0, p[dst]))
                gamma = math.log(e[src]) / math.log(p[src]) if 0 < p[src] < 1 and 0 < e[src] < 1 else 1.0
                power = p[dst] ** gamma
                rows["mult"].append(math.log(mult / e[dst]))
                rows["power"].append(math.log(power / e[dst]))
                if (src, dst) in ((16, 4), (4, 16)):
                    detail.append(f"{task:8s} {name:32s} {src:2d}->{dst:2d} meas {e[dst]:.3f} mult {mult:.3f} power {power:.3f} (src meas {e[src]:.3f} prior {p[src]:.3f})")
for line in detail:
    print(line)
for k, v in rows.items():
    v2 = sorted(abs(x) for x in v)
    print(f"{k:5s}: n {len(v)}  mean log(pred/meas) {sum(v)/len(v):+.3f}  median |log| {v2[len(v2)//2]:.3f}  90th |log| {v2[int(0.9*len(v2))]:.3f}  under (pred < meas) {sum(x < 0 for x in v)}")
