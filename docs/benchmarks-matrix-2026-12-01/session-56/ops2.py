import time, torch
torch.set_num_threads(1)
for n in (140_000, 3_400_000):
    x = torch.randn(n); p = x.to(torch.float16); b = x.to(torch.bfloat16); lim = 65504.0
    def t(label, f, reps=200):
        f(); t0 = time.perf_counter()
        for _ in range(reps): f()
        print(f"{n:8d} {label:34s} {(time.perf_counter()-t0)/reps*1e6:9.1f} us")
    t("x.to(fp16)", lambda: x.to(torch.float16))
    t("x.sum() f32", lambda: x.sum())
    t("p.sum(dtype=f32)", lambda: p.sum(dtype=torch.float32))
    t("p.sum() fp16", lambda: p.sum())
    t("p.clamp_", lambda: p.clamp_(-lim, lim))
    t("p.isfinite().all()", lambda: p.isfinite().all())
    t("x.isfinite().all()", lambda: x.isfinite().all())
    t("p.float().sum()", lambda: p.float().sum())
    t("b.sum(dtype=f32)", lambda: b.sum(dtype=torch.float32))
    t("p.view(int16).bitwise_and(0x7c00)...", lambda: None)
    t("p.abs().amax()", lambda: p.abs().amax())
    t("torch.aminmax(p)", lambda: torch.aminmax(p))
    t("torch.aminmax(x)", lambda: torch.aminmax(x))
    y = torch.empty(n)
    t("y.copy_(p)", lambda: y.copy_(p))
    t("p.to(f32) ", lambda: p.to(torch.float32))
