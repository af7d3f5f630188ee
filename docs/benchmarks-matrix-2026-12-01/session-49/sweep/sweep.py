"""Robustness sweep: DDP configurations x autocomp modes; replicas must stay identical."""
import datetime, os, sys, tempfile, traceback, json
from pathlib import Path
import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
import autocomp

class Net(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        dt = torch.bfloat16 if cfg.get("bf16") else torch.float32
        self.emb = nn.Embedding(500, 64, sparse=cfg.get("sparse", False))
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.bn = nn.BatchNorm1d(64) if cfg.get("bn") else nn.Identity()
        self.fc1 = nn.Linear(64 + 16 * 8 * 8, 256)
        self.fc2 = nn.Linear(256, 128)
        self.side = nn.Linear(256, 128)  # maybe unused
        self.head = nn.Linear(128, 500)
        if cfg.get("tied"):
            self.head2 = nn.Linear(64, 500, bias=False); self.head2.weight = self.emb.weight
        if cfg.get("noncontig"):
            self.fc2.weight = nn.Parameter(torch.randn(128, 256).t().contiguous().t() * 0.05)
        if cfg.get("scalar"):
            self.temp = nn.Parameter(torch.tensor(1.0))
        if cfg.get("frozen"):
            self.fc1.weight.requires_grad_(False)
        self.to(dt)
        if cfg.get("channels_last"):
            self.conv.to(memory_format=torch.channels_last)

    def forward(self, tok, img, step, rank):
        e = self.emb(tok).mean(1)
        e = self.bn(e)
        if self.cfg.get("channels_last"):
            img = img.to(memory_format=torch.channels_last)
        c = F.relu(self.conv(img)).flatten(1)
        if self.cfg.get("ckpt"):
            import torch.utils.checkpoint as cp
            h = cp.checkpoint(lambda t: F.relu(self.fc1(t)), torch.cat([e, c], 1), use_reentrant=False)
        else:
            h = F.relu(self.fc1(torch.cat([e, c], 1)))
        if self.cfg.get("unused") == "rank" and rank == 1:
            z = F.relu(self.fc2(h))
        elif self.cfg.get("unused") == "step" and step % 3 == 0:
            z = F.relu(self.fc2(h))
        else:
            z = F.relu(self.fc2(h) + self.side(h))
        out = self.head(z)
        if self.cfg.get("tied"):
            out = out + F.linear(e, self.head2.weight)
        if self.cfg.get("scalar"):
            out = out * self.temp
        return out

def run(rank, world, store, cfg, mode, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    result = {"ok": False}
    try:
        torch.manual_seed(0)
        net = Net(cfg)
        kw = {}
        for k in ("find_unused_parameters", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb"):
            if k in cfg: kw[k] = cfg[k]
        if cfg.get("unused"): kw["find_unused_parameters"] = True
        ddp = DDP(net, **kw)
        model = torch.compile(ddp) if cfg.get("compile") else ddp
        if mode == "adaptive":
            ctl = autocomp.wrap(ddp, target_overlap=0.9, window=5, warmup_steps=3)
        else:
            ctl = autocomp.wrap(ddp, plan={"*": mode})
        params = [p for p in ddp.parameters() if p.requires_grad]
        if cfg.get("sparse"):
            opt = torch.optim.SGD(params, lr=0.05)
        elif cfg.get("zero"):
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=1e-3)
        else:
            opt = torch.optim.Adam(params, lr=1e-3)
        g = torch.Generator().manual_seed(1 + rank)
        losses = []
        dt = torch.bfloat16 if cfg.get("bf16") else torch.float32
        for step in range(cfg.get("steps", 30)):
            accum = cfg.get("accum", 1)
            opt.zero_grad(set_to_none=not cfg.get("keep_grads"))
            for micro in range(accum):
                tok = torch.randint(0, 500, (16, 8), generator=g)
                img = torch.randn(16, 1, 8, 8, generator=g).to(dt)
                y = tok[:, 0]
                ctx = ddp.no_sync() if micro < accum - 1 else __import__("contextlib").nullcontext()
                with ctx:
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(cfg.get("autocast"))):
                        loss = F.cross_entropy(model(tok, img, step, rank).float(), y)
                    loss.backward()
            if cfg.get("clip"):
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            ctl.observe_loss(loss.item()) if mode == "adaptive" else None
            losses.append(loss.item())
        flat = torch.cat([p.detach().float().flatten() for p in net.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        diff = (gathered[0] - gathered[1]).abs().max().item()
        result = {"ok": True, "diff": diff, "first": losses[0], "last": sum(losses[-5:]) / 5, "plan": sorted(set(ctl.plan.values())), "finite": bool(torch.isfinite(flat).all())}
        ctl.close()
    except Exception as e:
        result = {"ok": False, "err": f"{type(e).__name__}: {e}"[:400], "tb": traceback.format_exc()[-1500:]}
    Path(out + f".{rank}").write_text(json.dumps(result))
    try:
        dist.destroy_process_group()
    except Exception:
        pass

CONFIGS = {
    "base": {},
    "frozen": {"frozen": True},
    "accum": {"accum": 2},
    "unused_step": {"unused": "step"},
    "unused_rank": {"unused": "rank"},
    "static_graph": {"static_graph": True},
    "channels_last": {"channels_last": True},
    "tied": {"tied": True},
    "smallbuckets": {"bucket_cap_mb": 0.05},
    "gabv": {"gradient_as_bucket_view": True},
    "clip": {"clip": True},
    "keep_grads": {"keep_grads": True},
    "bf16": {"bf16": True},
    "sparse": {"sparse": True},
    "bn": {"bn": True},
    "noncontig": {"noncontig": True},
    "scalar": {"scalar": True},
    "zero": {"zero": True},
    "ckpt": {"ckpt": True},
    "autocast": {"autocast": True},
    "compile": {"compile": True, "steps": 12},
}
MODES = ["adaptive", "powersgd:rank=4", "topk:ratio=0.01", "int8", "fp16", "sign"]

if __name__ == "__main__":
    names = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] != "all" else list(CONFIGS)
    modes = sys.argv[2].split(",") if len(sys.argv) > 2 else MODES
    for name in names:
        for mode in modes:
            with tempfile.TemporaryDirectory() as t:
                out = str(Path(t) / "r")
                try:
                    ctx = mp.start_processes(run, args=(2, str(Path(t) / "s"), CONFIGS[name], mode, out), nprocs=2, start_method="spawn", join=False)
                    import time; t0 = time.time()
                    while not ctx.join(timeout=5):
                        if time.time() - t0 > 120:
                            for p in ctx.processes: p.kill()
                            print(name, mode, "HANG"); break
                except Exception as e:
                    print(name, mode, "PROC", str(e)[:200])
                rs = []
                for r in range(2):
                    p = Path(out + f".{r}")
                    rs.append(json.loads(p.read_text()) if p.exists() else {"ok": False, "err": "no result"})
                if all(r["ok"] for r in rs):
                    r = rs[0]
                    flag = "" if r["diff"] == 0 and r["finite"] and r["last"] < r["first"] else "  <-- CHECK"
                    print(f"{name:14s} {mode:18s} diff {r['diff']:.2e} loss {r['first']:.3f}->{r['last']:.3f} {r['plan']}{flag}", flush=True)
                else:
                    for i, r in enumerate(rs):
                        print(f"{name:14s} {mode:18s} rank{i} FAIL {r.get('err')}", flush=True)
                    print(rs[0].get("tb", "")[-800:])
