"""Relative error of compressors on the LSTM LM's gradients: one fresh gradient (the advisor's
old measurement, six power iterations) against error feedback over consecutive steps (in use).

Run from the repository root: .venv/bin/python docs/advisor-in-use-error-2026-11-26/in_use_error.py
"""
import torch, statistics
from autocomp_bench.tasks import build_task
from autocomp.compressors import build_compressor, run_rounds_locally
from autocomp.hook_layer import LayerSlot, encode_locally, _ReplayHookState
torch.manual_seed(0); torch.set_num_threads(1)
task = build_task("lstm-lm")
model = task.build_model(); opt = task.make_optimizer(model.parameters())
names = ["lstm.weight_hh_l1", "lstm.weight_ih_l0", "head.weight", "embed.weight"]
params = dict(model.named_parameters())
seqs = {n: [] for n in names}
for step in range(260):
    x, y = task.batch(0, step, 0)
    loss = task.loss(model(x), y)
    opt.zero_grad(); loss.backward()
    if step < 40 or step >= 200:
        for n in names: seqs[n].append(params[n].grad.detach().clone())
    opt.step()
def one_grad(spec, g):
    c = build_compressor(spec); st = c.init_state(g.shape, 0, 0)
    slot = LayerSlot("r", g.shape, g.dtype, 0, c); slot.state = st
    hs = _ReplayHookState()
    for _ in range(6):
        encode_locally(slot, g.reshape(-1), hs); hs.step += 1
    x = g.float().clone()
    est = c.decompress(run_rounds_locally(c, x, slot.state), x.shape, slot.state)
    return float((est - x).norm() / x.norm())
def seq_ef(spec, grads):
    g0 = grads[0]; c = build_compressor(spec)
    slot = LayerSlot("r", g0.shape, g0.dtype, 0, c); slot.state = c.init_state(g0.shape, 0, 0)
    hs = _ReplayHookState(); errs = []
    for g in grads:
        prev = slot.residual.reshape(-1).clone() if slot.residual is not None else torch.zeros(g.numel())
        x = prev + g.reshape(-1).float()
        encode_locally(slot, g.reshape(-1), hs); hs.step += 1
        r = slot.residual.reshape(-1) if slot.residual is not None else torch.zeros_like(x)
        errs.append(float(r.norm() / x.norm()))
    return errs
for n in names:
    print(n, tuple(seqs[n][0].shape))
    for spec in ["powersgd:rank=1", "powersgd:rank=4", "powersgd:rank=16", "topk:ratio=0.01", "int8"]:
        early, late = seqs[n][:40], seqs[n][40:]
        e = seq_ef(spec, early); l = seq_ef(spec, late)
        print(f"  {spec:18s} 1grad6it={one_grad(spec, early[0]):.3f} late1grad={one_grad(spec, late[0]):.3f} "
              f"K2={statistics.mean(e[1:2]):.3f} K4={statistics.mean(e[1:4]):.3f} K8={statistics.mean(e[1:8]):.3f} "
              f"steady(early30-40)={statistics.mean(e[30:]):.3f} | late K4={statistics.mean(l[1:4]):.3f} late steady={statistics.mean(l[30:]):.3f}")
