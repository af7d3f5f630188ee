"""Small torch.distributed helpers that keep ranks from silently disagreeing.

A plan that differs between ranks would make the comm hook issue differently sized
collectives, which gloo reports as an obscure size mismatch and NCCL may turn into a hang.
Comparing a digest once, up front, turns that into a clear error on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

ProcessGroup = dist.ProcessGroup


def collective_device(group: ProcessGroup | None) -> torch.device:
    """Device a small control tensor must live on for ``group``'s backend."""
    backend = dist.get_backend(group)
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_digests(digest: bytes, group: ProcessGroup | None) -> list[bytes]:
    """Every rank's ``digest`` (32 bytes), in rank order; one all-gather."""
    if len(digest) != 32:
        raise ValueError("digest must be 32 bytes (SHA-256)")
    world = dist.get_world_size(group)
    device = collective_device(group)
    local = torch.frombuffer(bytearray(digest), dtype=torch.int64).to(device)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local, group=group)
    return [t.cpu().numpy().tobytes() for t in gathered]


def require_same_on_all_ranks(digest: bytes, group: ProcessGroup | None, what: str) -> None:
    """Raise RuntimeError on every rank if ``digest`` differs anywhere in ``group``."""
    digests = gather_digests(digest, group)
    if len(set(digests)) == 1:
        return
    reference = digests[0]
    differing = [r for r, d in enumerate(digests) if d != reference]
    raise RuntimeError(
        f"{what} differs between ranks: ranks {differing} disagree with rank 0. Every rank "
        "must build the same model and pass the same plan; refusing to start rather than "
        "issue mismatched collectives."
    )


def raise_together(error: Exception | None, group: ProcessGroup | None, what: str) -> None:
    """Collective: if any rank hit ``error``, raise on every rank (never strand the others).

    Call it on every rank after a local validation that may fail on some ranks only: the ranks
    that passed would otherwise enter the next collective alone and wait for a timeout.
    """
    failed = torch.tensor([0 if error is None else 1], dtype=torch.int64)
    failed = failed.to(collective_device(group))
    dist.all_reduce(failed, group=group)
    if error is not None:
        raise error
    if int(failed.item()):
        raise RuntimeError(f"{what} failed on another rank; see that rank's error")
