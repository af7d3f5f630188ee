import time, statistics, torch
torch.set_num_threads(1)
n = 1_396_416
L = torch.finfo(torch.float16).max
x = torch.randn(n) * 1e-3
big = torch.randn(64 << 20 >> 2)  # 64 MB to evict caches between reps
def t(fn, reps=40):
    ts = []
    for _ in range(reps):
        big.mul_(1.0)
        s = time.perf_counter(); fn(); ts.append(time.perf_counter() - s)
    return statistics.median(ts) * 1e3
out16 = torch.empty(n, dtype=torch.float16)
variants = {
 "pytorch: to(fp16).div_(2)": lambda: x.to(torch.float16).div_(2),
 "to(fp16)": lambda: x.to(torch.float16),
 "to(fp16).clamp_": lambda: x.to(torch.float16).clamp_(-L, L),
 "to(fp16).nan_to_num_": lambda: x.to(torch.float16).nan_to_num_(nan=float('nan'), posinf=L, neginf=-L),
 "clamp fp32 -> to(fp16)": lambda: torch.clamp(x, -L, L).to(torch.float16),
 "x.sum fp32": lambda: x.sum(dtype=torch.float32),
 "x.mul_(0.5)": lambda: x.mul_(1.0),
 "mul(x,0.5,out=fp16)": lambda: torch.mul(x, 0.5, out=out16),
 "clamp(x,out=fp16)": lambda: torch.clamp(x, -L, L, out=out16),
 "out16.copy_(x)": lambda: out16.copy_(x),
 "x.copy_(out16)": lambda: x.copy_(out16),
}
for k, fn in variants.items():
    try:
        print(f"{k:28s} {t(fn):.3f} ms")
    except Exception as e:
        print(k, "ERR", e)
