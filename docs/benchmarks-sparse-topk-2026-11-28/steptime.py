import time, torch, sys
torch.set_num_threads(1)
from autocomp_bench.tasks import build_task
for name in sys.argv[1:]:
    task = build_task(name)
    torch.manual_seed(0)
    m = task.build_model(); opt = task.make_optimizer(m.parameters())
    times = []; tb = []; tf=[]; to=[]
    for step in range(40):
        t0 = time.perf_counter()
        x, y = task.batch(0, step, 0)
        t1 = time.perf_counter()
        opt.zero_grad(); loss = task.loss(m(x), y)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        opt.step()
        t4 = time.perf_counter()
        times.append(t4 - t0); tb.append(t1-t0); tf.append(t2-t1); to.append(t4-t3)
    med = lambda v: sorted(v[10:])[len(v[10:])//2]*1e3
    print(name, f"step {med(times):.1f} ms  batch {med(tb):.1f}  fwd {med(tf):.1f}  opt {med(to):.1f}")
