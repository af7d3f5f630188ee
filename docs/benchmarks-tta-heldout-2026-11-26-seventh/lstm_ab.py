import json, os, sys, tempfile, datetime
import torch, torch.distributed as dist, torch.multiprocessing as mp

PLAN = {"embed.weight": "fp16", "*bias*": "none", "*": "powersgd:rank=4"}

def run(rank, world, path, mode, steps, out):
    os.environ.setdefault("AUTOCOMP_LOG_LEVEL", "WARNING")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    import autocomp
    from autocomp_bench.tasks import build_task
    from torch.nn.parallel import DistributedDataParallel as DDP
    task = build_task("lstm-lm")
    torch.manual_seed(0)
    model = task.build_model()
    ddp = DDP(model, init_sync=False)
    if mode == "static":
        ctl = autocomp.wrap(ddp, plan=PLAN, warmup_steps=2)
    elif mode == "pinned":
        ctl = autocomp.wrap(ddp, plan=PLAN, target_overlap=0.9, warmup_steps=2)
    elif mode in ("switch", "direct", "switch_fp16", "switch_int8", "switch_int8_reset"):
        ctl = autocomp.wrap(ddp, plan={"*": "none"})
    elif mode.startswith("adaptive"):
        kw = json.loads(mode.split(":", 1)[1]) if ":" in mode else {}
        ctl = autocomp.wrap(ddp, target_overlap=0.9, **kw)
    opt = task.make_optimizer(ddp.parameters())
    curve = []
    from autocomp.compressors import build_compressor
    step1 = {"lstm.weight_ih_l0": "fp16:ef=false", "lstm.weight_hh_l0": "int8:chunk=256,ef=true",
             "lstm.weight_ih_l1": "int8:chunk=256,ef=true", "lstm.weight_hh_l1": "int8:chunk=256,ef=true",
             "head.weight": "fp16:ef=false"}
    final = {"embed.weight": "fp16:ef=false", **{k: "powersgd:rank=4,ef=true" for k in step1}}
    def assign(specs):
        names = ctl._state.slots
        ctl._state.assign({n: build_compressor(specs.get(n, "none")) for n in names})
    for step in range(steps):
        if mode == "switch" and step == 1:
            assign(step1)
        if mode == "switch_fp16" and step == 1:
            assign({k: "fp16:ef=false" for k in step1})
        if mode.startswith("switch_int8") and step == 1:
            assign({k: "int8:chunk=256,ef=true" for k in step1})
        if mode == "switch_int8_reset" and step == 2:
            for slot in ctl._state.slots.values():
                slot.residual = None
        if mode != "static" and mode != "pinned" and not mode.startswith("adaptive") and step == 2:
            assign(final)
        x, y = task.batch(rank, step, 0)
        loss = task.loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if mode != "static":
            ctl.observe_loss(loss.detach())
        if (step + 1) % 25 == 0 and rank == 0:
            curve.append((step + 1, round(task.evaluate(model)["valid_loss"], 4)))
    if rank == 0:
        print(mode, curve, dict(list(ctl.plan.items())[:3]), flush=True)
    dist.barrier()
    ctl.close()
    os._exit(0)

if __name__ == "__main__":
    mode, steps = sys.argv[1], int(sys.argv[2])
    path = tempfile.mktemp()
    mp.spawn(run, args=(2, path, mode, steps, None), nprocs=2, join=True)
