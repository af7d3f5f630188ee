# Step-matched validation loss of static plans on gpt (loopback, 2 gloo ranks): what a plan
# learns per step, apart from its speed. Plans in turn per seed, each a fresh model and
# process pair. python perstep.py STEPS SEEDS [PLANS]   (PYTHONPATH=<repo>; WORK=dir for the JSON)
import json, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import torch.multiprocessing as mp

PLANS = {
    "none": {"*": "none"},
    "rank4": {"*": "powersgd:rank=4"},
    "fp16-mlp2": {"blocks.2.mlp.*weight": "fp16:ef=false", "*": "powersgd:rank=4"},
    "int8-proj": {"*out_proj.weight": "int8:chunk=256", "*": "powersgd:rank=4"},
    # Twenty-third session (docs/benchmarks-l1-2026-11-28/perstep-embed-mlp0.json).
    "int8-embed": {"embed.weight": "int8:chunk=256", "*": "powersgd:rank=4"},
    "int8-mlp0": {"blocks.0.mlp.2.weight": "int8:chunk=256", "*": "powersgd:rank=4"},
}


def worker(rank, plan, steps, seed, store, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, store=dist.FileStore(store, 2))
    import autocomp
    from autocomp_bench.tasks import build_task
    task = build_task("gpt")
    torch.manual_seed(seed)
    model = task.build_model()
    ddp = DDP(model, bucket_cap_mb=None)
    ctl = autocomp.wrap(ddp, plan=PLANS[plan], warmup_steps=2, run_dir=False)
    opt = task.make_optimizer(ddp.parameters())
    curve = {}
    for step in range(steps):
        x, y = task.batch(rank, step, seed)
        loss = task.loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and (step + 1) % 50 == 0:
            curve[step + 1] = task.evaluate(model)["valid_loss"]
    if rank == 0:
        json.dump(curve, open(out, "w"))
    ctl.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    steps, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")]
    res = {}
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else list(PLANS)
    for seed in seeds:
        for plan in only:
            store, out = f"/tmp/perstep-store-{plan}-{seed}", f"/tmp/perstep-{plan}-{seed}.json"
            if os.path.exists(store):
                os.remove(store)
            mp.spawn(worker, args=(plan, steps, seed, store, out), nprocs=2)
            res.setdefault(plan, {})[seed] = json.load(open(out))
            print(plan, seed, res[plan][seed], flush=True)
    out_dir = os.environ.get("WORK", "/tmp/s22")
    json.dump(res, open(f"{out_dir}/perstep-{'-'.join(only)}.json", "w"))
