"""Repeat the hierarchical hook's CUDA test and say where the ranks first part.

4 gloo ranks share ``cuda:0`` as two nodes of two (``tests/gpu/test_multirank_cuda.py``'s
setup: MultiBucketNet, the mixed plan, 30 SGD steps). Each trial records every parameter's
bytes after every step on every rank, and reports the first step and the parameters at which
a rank differs from rank 0. ``--variant old`` puts back random-k's ``index_add_`` decode.
Trials run until ``--seconds`` have passed. Usage (repo root on PYTHONPATH):
python docs/gpu-2026-11-26/hierarchy_trials.py --variant new --seconds 200 --out trials.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from autocomp.compressors.sparse import RandomK
from tests.models import MultiBucketNet, classification_batch
from tests.multirank import run_ranks
from tests.test_hierarchy import MIXED_PLAN

STEPS = 30


def _old_decompress(self: RandomK, payload: torch.Tensor, shape: torch.Size, state: dict) -> Any:
    numel = shape.numel()
    indices = self._indices(numel, state, payload.device)
    out = torch.zeros(numel, dtype=torch.float32, device=payload.device)
    if self.config["unbiased"]:
        out.index_add_(0, indices, payload.to(torch.float32))
    else:
        out[indices] = payload.to(torch.float32)
    return out.reshape(shape)


def _worker(rank: int, world_size: int, variant: str) -> dict[str, Any]:
    if variant == "old":
        RandomK.decompress = _old_decompress  # type: ignore[method-assign]
    os.environ["GROUP_RANK"] = str(rank // 2)
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    os.environ["LOCAL_RANK"] = str(rank % 2)
    cuda = torch.cuda.is_available()  # the CPU only to try the script out
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = MultiBucketNet().to(device)
    ddp = DDP(model, device_ids=[0] if cuda else None, bucket_cap_mb=0.02)
    ctl = autocomp.wrap(ddp, plan=MIXED_PLAN, hierarchy=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    digests = []
    for step in range(STEPS):
        x, y = classification_batch(rank, step)
        loss = torch.nn.functional.cross_entropy(ddp(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        # the gradients as DDP left them (the hook's output), then the parameters
        grads = {
            f"grad:{n}": hashlib.sha1(p.grad.cpu().numpy().tobytes()).hexdigest()[:12]
            for n, p in model.named_parameters()
        }
        opt.step()
        digests.append(grads)
    owned = sorted(ctl._state.hierarchy.owned()) if ctl._state.hierarchy else []
    return {"digests": digests, "owned": owned}


def trial(variant: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        results = run_ranks(_worker, 4, Path(tmp), variant, timeout=240)
    first = None
    for step in range(STEPS):
        parted = {
            name: [r["digests"][step][name] for r in results]
            for name in results[0]["digests"][step]
            if len({r["digests"][step][name] for r in results}) > 1
        }
        if parted:
            first = {"step": step, "parted": parted}
            break
    return {
        "variant": variant,
        "identical": first is None,
        "first_difference": first,
        "owned": [r["owned"] for r in results],
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=["old", "new"], required=True)
    parser.add_argument("--seconds", type=float, default=200.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    deadline = time.monotonic() + args.seconds
    with open(args.out, "a") as out:
        while time.monotonic() < deadline:
            try:
                row = trial(args.variant)
            except Exception as err:  # a hung or failed trial is a result too
                row = {"variant": args.variant, "error": str(err)[-2000:]}
            out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
