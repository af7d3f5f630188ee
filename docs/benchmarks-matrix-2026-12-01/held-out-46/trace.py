"""Per-step times and autocomp's INFO log on rank 0 of a 2-rank adaptive run over tbf.
    python trace.py TASK RATE_MBIT STEPS [FROM TO]; METHOD=fp16 traces PyTorch's fp16 hook
    instead, METHOD=plan:SPEC autocomp's static plan SPEC on every layer, DEBUG=1 logs at debug level."""
import datetime, logging, os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
def train():
    import autocomp
    from autocomp_bench.tasks import build_task
    torch.set_num_threads(1)
    rank = dist.get_rank()
    if rank == 0:
        logging.basicConfig(level=logging.DEBUG if os.environ.get("DEBUG") else logging.INFO, format="%(relativeCreated)7d %(name)s %(message)s")
        logging.getLogger("autocomp").setLevel(logging.DEBUG if os.environ.get("DEBUG") else logging.INFO)
    spec = build_task(sys.argv[1]); torch.manual_seed(0)
    ddp = DDP(spec.build_model())
    if os.environ.get("METHOD") == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook); ctl = None
    elif os.environ.get("METHOD", "").startswith("plan:"):  # e.g. METHOD='plan:fp16:ef=false'
        plan = {"*": os.environ["METHOD"][len("plan:"):]}
        ctl = autocomp.wrap(ddp, plan=plan, warmup_steps=2, run_dir=False)
    else:
        ctl = autocomp.wrap(ddp, target_overlap=0.9, run_dir=False)
    opt = spec.make_optimizer(ddp.parameters())
    lo, hi = (int(sys.argv[4]), int(sys.argv[5])) if len(sys.argv) > 5 else (0, 10**9)
    for step in range(int(sys.argv[3])):
        t0 = time.perf_counter()
        x, y = spec.batch(rank, step, 1)
        loss = spec.loss(ddp(x), y); opt.zero_grad(); loss.backward(); opt.step()
        if ctl is not None:
            ctl.observe_loss(float(loss.item()))
        c = torch.tensor([time.perf_counter()], dtype=torch.float64); dist.all_reduce(c, op=dist.ReduceOp.MAX)
        if rank == 0 and lo <= step < hi:
            print(f"STEP {step} {1e3*(time.perf_counter()-t0):.1f} ms", flush=True)
    if ctl is not None:
        ctl.close()
    dist.destroy_process_group()
if __name__ == "__main__":
    if os.environ.get("CAP_WORKER"):
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120)); train()
    else:
        from autocomp_bench.shaped_link import ShapedLink
        with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=float(sys.argv[2]))) as link:
            env = {"CAP_WORKER": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd()), **{k: os.environ[k] for k in ("DEBUG", "METHOD") if os.environ.get(k)}}
            procs = [link.popen(h, [sys.executable, *sys.argv], env={**link.rank_env(h, world_size=2, master_port=29543), **env}) for h in range(2)]
            print("exit codes", [p.wait(timeout=900) for p in procs])
