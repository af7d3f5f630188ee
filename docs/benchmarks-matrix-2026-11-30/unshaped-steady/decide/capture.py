"""Capture PolicyEngine.decide inputs (pickled engine + arguments) on rank 0 of a 2-rank
adaptive run, for replay.py and whatif.py.

    python capture.py TASK RATE_MBIT STEPS OUT.pkl                 # over a tbf-shaped link
    python capture.py TASK unshaped STEPS OUT.pkl --clock --data-seed 1   # on loopback

--clock adds the tta loop's per-step work (loss.item(), an 8-byte MAX all-reduce);
--data-seed picks the task's batches (default 0).
"""
import argparse, datetime, os, pickle, sys, tempfile, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def train(args: argparse.Namespace) -> None:
    """Every rank, in an initialized process group."""
    import autocomp
    import autocomp.policy.engine as E
    from autocomp_bench.tasks import build_task
    torch.set_num_threads(1)
    rank = dist.get_rank()
    captured = []
    orig = E.PolicyEngine.decide
    def decide(self, *a, **k):
        blob = pickle.dumps((self, a, k))
        t = time.perf_counter()
        result = orig(self, *a, **k)
        captured.append((blob, time.perf_counter() - t, result.plan, result.step))
        return result
    E.PolicyEngine.decide = decide
    spec = build_task(args.task)
    torch.manual_seed(0)
    ddp = DDP(spec.build_model())
    ctl = autocomp.wrap(ddp, target_overlap=0.9, run_dir=False)
    opt = spec.make_optimizer(ddp.parameters())
    for step in range(args.steps):
        x, y = spec.batch(rank, step, args.data_seed)
        loss = spec.loss(ddp(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if args.clock:
            ctl.observe_loss(float(loss.item()))
            clock = torch.tensor([time.perf_counter()], dtype=torch.float64)
            dist.all_reduce(clock, op=dist.ReduceOp.MAX)
    ctl.close()
    if rank == 0:
        with open(args.out, "wb") as f:
            pickle.dump(captured, f)
        print("captured", len(captured), "decisions:",
              [(c[3], round(c[1] * 1e3, 1), sorted(set(c[2].values()))) for c in captured])
    dist.destroy_process_group()


def loopback_rank(rank: int, store: str, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    train(args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task"); parser.add_argument("rate"); parser.add_argument("steps", type=int)
    parser.add_argument("out"); parser.add_argument("--clock", action="store_true")
    parser.add_argument("--data-seed", type=int, default=0)
    args = parser.parse_args()
    if os.environ.get("CAP_WORKER"):  # a rank inside the shaped link's namespaces
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
        train(args)
    elif args.rate == "unshaped":
        mp.spawn(loopback_rank, args=(tempfile.mktemp(), args), nprocs=2)
    else:
        from autocomp_bench.shaped_link import ShapedLink
        with ShapedLink(ShapedLink.Config(hosts=2, rate_mbit=float(args.rate))) as link:
            env = {"CAP_WORKER": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
            procs = [link.popen(h, [sys.executable, *sys.argv],
                                env={**link.rank_env(h, world_size=2, master_port=29541), **env})
                     for h in range(2)]
            print("exit codes", [p.wait(timeout=900) for p in procs])


if __name__ == "__main__":
    main()
