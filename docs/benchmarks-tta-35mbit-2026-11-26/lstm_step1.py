"""Per-step quality on the LSTM LM, 2 gloo ranks on loopback, seed 0: PyTorch's PowerSGD hook
(rank 4, one bucket, start_powerSGD_iter=2) against autocomp with the same plan, static or
switched by hand as the adaptive run did at 35 Mbit/s (step 1: int8 on the LSTM matrices and
fp16 on embedding and head; step 2 on: rank 4 everywhere)."""
import datetime, os, sys, tempfile
import torch, torch.distributed as dist, torch.multiprocessing as mp

def run(rank, world, path, mode, steps):
    seed = int(os.environ.get("SEED", "0"))
    os.environ.setdefault("AUTOCOMP_LOG_LEVEL", "WARNING")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    import autocomp
    from autocomp.compressors import build_compressor
    from autocomp_bench.tasks import build_task
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    task = build_task("lstm-lm")
    torch.manual_seed(seed)
    model = task.build_model()
    ctl = None
    if mode == "hook":
        ddp = DDP(model, bucket_cap_mb=1024, init_sync=False)
        st = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                         start_powerSGD_iter=2, min_compression_rate=2,
                                         use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(st, powerSGD_hook.powerSGD_hook)
    else:
        bucket = 1024 if mode.endswith("_1b") else 25
        ddp = DDP(model, bucket_cap_mb=bucket, init_sync=False)
        if mode.startswith("static") or mode.startswith("noise"):
            ctl = autocomp.wrap(ddp, plan={"*bias*": "none", "*": "powersgd:rank=4"}, warmup_steps=2)
        else:
            ctl = autocomp.wrap(ddp, plan={"*": "none"})
    opt = task.make_optimizer(ddp.parameters())
    names = [n for n, _ in model.named_parameters()]
    mats = [n for n in names if "bias" not in n]
    def assign(specs):
        ctl._state.assign({n: build_compressor(specs.get(n, "none")) for n in names})
    curve = []
    for step in range(steps):
        if mode.startswith("switch") and step == 1:
            if mode == "switch_int8only":
                assign({n: "int8" for n in mats if n not in ("embed.weight", "head.weight")})
            elif mode == "switch_fp16only":
                assign({n: "fp16:ef=false" for n in ("embed.weight", "head.weight")})
            elif mode == "switch_none":
                pass
            elif mode in ("switch_int8_then_none",):
                assign({n: "int8" for n in mats if n not in ("embed.weight", "head.weight")})
            elif mode == "switch_int8noef":
                assign({n: "int8:ef=false" for n in mats if n not in ("embed.weight", "head.weight")})
            elif mode == "switch_late":
                pass
            else:
                assign({n: ("fp16:ef=false" if n in ("embed.weight", "head.weight") else "int8") for n in mats})
        if mode == "switch_late" and step == 2:
            assign({n: "int8" for n in mats if n not in ("embed.weight", "head.weight")})
        elif mode == "switch_int8_then_none" and step == 2:
            assign({n: "none" for n in mats})
        elif mode.startswith("switch") and step == 2:
            assign({n: "powersgd:rank=4" for n in mats})
        if mode == "switch_late" and step == 3:
            assign({n: "powersgd:rank=4" for n in mats})
        if mode.startswith("switch") and step == 2 and rank == 0:
            for n in mats:
                slot = ctl._state.slots[n]
                r = slot.residual
                g = dict(model.named_parameters())[n].grad
                print("residual", n, None if r is None else (tuple(r.shape), float(r.norm()), float(g.norm())), flush=True)
        if mode == "switch_reset" and step == 2:
            for slot in ctl._state.slots.values():
                slot.residual = None
        x, y = task.batch(rank, step, seed)
        loss = task.loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if mode.startswith("noise") and step == 1:
            gen = torch.Generator().manual_seed(int(mode.split(":")[1]))
            for p in model.parameters():
                if p.grad is not None:
                    e = torch.randn(p.grad.shape, generator=gen)
                    p.grad.add_(e * (0.005 * p.grad.norm() / e.norm()))
        opt.step()
        if (step + 1) % 50 == 0 and rank == 0:
            curve.append((step + 1, round(task.evaluate(model)["valid_loss"], 4)))
    if rank == 0:
        print(mode, curve, flush=True)
    dist.barrier()
    if ctl is not None:
        ctl.close()
    os._exit(0)

if __name__ == "__main__":
    steps = int(sys.argv[1])
    for mode in sys.argv[2:]:
        path = tempfile.mktemp()
        mp.spawn(run, args=(2, path, mode, steps), nprocs=2, join=True)
