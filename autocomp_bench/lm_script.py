"""The link benchmark's workload as a plain DDP training script, for ``autocomp-advisor profile``.

The advisor-accuracy benchmark (:mod:`autocomp_bench.advisor_accuracy`) profiles this file
the way a user profiles their own script, then compares the advisor's predictions with the
step times :mod:`autocomp_bench.link` measures for the same task (``mlp-lm-large``: model,
optimizer, batches) and threads. Run it under torchrun (or let the advisor spawn the ranks)::

    torchrun --nproc_per_node 2 autocomp_bench/lm_script.py --steps 20
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from autocomp_bench.harness import SEED
from autocomp_bench.tasks import build_task

TASK = "mlp-lm-large"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    task = build_task(TASK)
    torch.manual_seed(SEED)
    model = task.build_model()
    ddp = DDP(model)
    opt = task.make_optimizer(ddp.parameters())
    for step in range(args.steps):
        x, y = task.batch(rank, step, SEED)
        loss = task.loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
