"""Tier 2: the comm hook under DDP constructor options users set, on 2 gloo ranks.

``static_graph=True`` changes when DDP rebuilds its buckets and skips its per-iteration
search for unused parameters; ``find_unused_parameters=True`` marks parameters that got no
gradient ready with zeros, on one rank and not the other; a ``channels_last`` convolution puts
its gradient into the bucket in its own memory order, which the hook's flat view of the bucket
reads and writes back element for element. Each must leave the ranks bit-identical, and the
options that only change DDP's bookkeeping must not change a single bit of the result.
Parameters DDP is told to ignore never reach the hook, so autocomp must leave them out of its
plan and statistics. DDP's newer options (``skip_all_reduce_unused_params``,
``bucket_cap_mb_list``, ``batched_grad_copy``) are checked the same way, and so are the
habits of a training loop around the backward (a frozen layer, gradient clipping, zeroed
instead of freed gradients, activation checkpointing, ``ZeroRedundancyOptimizer``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

import autocomp
from tests.models import EVERY_COMPRESSOR_PLAN, MultiBucketNet, classification_batch
from tests.multirank import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

BUCKET_CAP_MB = 0.02  # MultiBucketNet over >= 3 buckets, as in test_hook_multirank
STEPS = 40


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _assert_learns_like(losses: list[float], uncompressed: list[float]) -> None:
    """The loss falls, and ends within 0.05 of the uncompressed run's (measured: within
    0.015 on both models here)."""
    start, end = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert end < 0.95 * start, f"loss did not fall: {start:.3f} -> {end:.3f}"
    reference = sum(uncompressed[-3:]) / 3
    assert abs(end - reference) < 0.05, f"{end:.3f} against {reference:.3f} uncompressed"


def _sgd(
    ddp: DDP, steps: int, loss_at: Callable[[int], torch.Tensor], momentum: float = 0.0
) -> list[float]:
    """``steps`` SGD steps (lr 0.05) on ``loss_at(step)``; the losses."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=momentum)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = loss_at(step)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _classify(rank: int, ddp: DDP, *args: Any) -> Callable[[int], torch.Tensor]:
    """The loss of ``ddp`` on this rank's classification batch of a step."""

    def loss_at(step: int) -> torch.Tensor:
        x, y = classification_batch(rank, step)
        return nn.functional.cross_entropy(ddp(x, *args), y)

    return loss_at


def _train_multibucket(rank: int, static_graph: bool) -> torch.Tensor:
    torch.manual_seed(0)
    model = MultiBucketNet()
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB, static_graph=static_graph)
    ctl = autocomp.wrap(ddp, plan=EVERY_COMPRESSOR_PLAN)
    _sgd(ddp, STEPS, _classify(rank, ddp), momentum=0.9)
    ctl.close()
    return _flat(model)


def _static_graph(rank: int, world_size: int) -> dict[bool, torch.Tensor]:
    return {static: _train_multibucket(rank, static) for static in (False, True)}


def test_static_graph_trains_to_the_same_bits(tmp_path: Path) -> None:
    """Every compressor family (PowerSGD's rounds pipelined across buckets included) gives
    the same parameters with ``static_graph=True`` as without: the hook's state is keyed by
    parameter name, not by DDP's bucket layout, which the static graph builds differently."""
    results = run_ranks(_static_graph, 2, tmp_path)
    for result in results:
        assert torch.equal(result[True], result[False])
    assert torch.equal(results[0][True], results[1][True])


class _BranchyNet(nn.Module):
    """A trunk and two heads; ``side`` is used only on some steps, differently per rank."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(16, 48)
        self.head = nn.Linear(48, 5)
        self.side = nn.Linear(48, 5)

    def forward(self, x: torch.Tensor, use_side: bool) -> torch.Tensor:
        h = torch.relu(self.trunk(x))
        out = self.head(h)
        return out + self.side(h) if use_side else out


def _unused(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for plan in ("ddp", "none", "powersgd:rank=2"):
        torch.manual_seed(0)
        model = _BranchyNet()
        ddp = DDP(model, find_unused_parameters=True)
        ctl = None if plan == "ddp" else autocomp.wrap(ddp, plan={"*.weight": plan, "*": "none"})

        def loss_at(step: int, ddp: DDP = ddp) -> torch.Tensor:
            x, y = classification_batch(rank, step)
            # Rank 0 uses ``side`` on even steps, rank 1 on steps divisible by 3.
            return nn.functional.cross_entropy(ddp(x, step % (2 + rank) == 0), y)

        losses = _sgd(ddp, STEPS, loss_at)
        if ctl is not None:
            ctl.close()
        out[plan] = {"params": _flat(model), "losses": losses}
    return out


def test_unused_parameters_on_one_rank_only(tmp_path: Path) -> None:
    """With ``find_unused_parameters=True`` and a branch each rank takes on different steps,
    a ``none`` plan gives plain DDP's bits, and PowerSGD keeps the ranks identical and
    learns as the uncompressed run does: the zeros DDP puts in for an unused parameter are
    just another gradient."""
    results = run_ranks(_unused, 2, tmp_path)
    for result in results:
        assert torch.equal(result["none"]["params"], result["ddp"]["params"])
    compressed = [r["powersgd:rank=2"] for r in results]
    assert torch.equal(compressed[0]["params"], compressed[1]["params"])
    _assert_learns_like(compressed[0]["losses"], results[0]["none"]["losses"])


class _ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.head(h.mean(dim=(2, 3)))


def _image_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(10_000 * (rank + 1) + step)
    x = torch.randn(16, 3, 8, 8, generator=gen)
    y = (x[:, 0].mean(dim=(1, 2)) > 0).long() + 2 * (x[:, 1].mean(dim=(1, 2)) > 0).long()
    return x.contiguous(memory_format=torch.channels_last), y


def _channels_last(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for plan in ("ddp", "none", "fp16:ef=false", "powersgd:rank=2"):
        torch.manual_seed(0)
        model = _ConvNet().to(memory_format=torch.channels_last)
        ddp = DDP(model)
        ctl = None if plan == "ddp" else autocomp.wrap(ddp, plan={"*.weight": plan, "*": "none"})
        x, y = _image_batch(rank, 0)
        nn.functional.cross_entropy(ddp(x), y).backward()
        grads = {
            name: p.grad.detach().clone()
            for name, p in model.named_parameters()
            if p.grad is not None
        }
        strides = {name: p.grad.stride() for name, p in model.named_parameters()}

        def loss_at(step: int, ddp: DDP = ddp) -> torch.Tensor:
            x, y = _image_batch(rank, step)
            return nn.functional.cross_entropy(ddp(x), y)

        losses = _sgd(ddp, STEPS, loss_at, momentum=0.9)
        if ctl is not None:
            ctl.close()
        out[plan] = {"grads": grads, "strides": strides, "params": _flat(model), "losses": losses}
    return out


def test_channels_last_gradients_land_where_ddp_puts_them(tmp_path: Path) -> None:
    """A ``channels_last`` conv weight's bucket slice is in NHWC order. A ``none`` plan gives
    DDP's bits; fp16 gives each gradient within fp16 rounding of DDP's, element by element
    (a write-back in another order would be off by the gradient's own size); PowerSGD keeps
    the ranks identical and learns as the uncompressed run does."""
    results = run_ranks(_channels_last, 2, tmp_path)
    for result in results:
        ddp = result["ddp"]
        assert ddp["strides"]["conv2.weight"] == result["none"]["strides"]["conv2.weight"]
        assert ddp["strides"]["conv2.weight"][1] == 1  # channels_last really reached the grad
        assert torch.equal(result["none"]["params"], ddp["params"])
        for name, reference in ddp["grads"].items():
            got = result["fp16:ef=false"]["grads"][name]
            scale = reference.abs().max().item()
            assert torch.allclose(got, reference, rtol=2e-3, atol=2e-3 * scale), name
    compressed = [r["powersgd:rank=2"] for r in results]
    assert torch.equal(compressed[0]["params"], compressed[1]["params"])
    _assert_learns_like(compressed[0]["losses"], results[0]["none"]["losses"])


def _ignored(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in ("static", "adaptive"):
        torch.manual_seed(0)
        model = _BranchyNet()
        DDP._set_params_and_buffers_to_ignore_for_model(model, ["side.weight", "side.bias"])
        ddp = DDP(model)
        if mode == "static":
            ctl = autocomp.wrap(ddp, plan={"*.weight": "powersgd:rank=2", "*": "none"})
        else:
            ctl = autocomp.wrap(ddp, target_overlap=0.9, window=5, warmup_steps=5)
        _sgd(ddp, STEPS // 2, _classify(rank, ddp, True))
        out[mode] = {
            "plan": sorted(ctl.plan),
            "stats": sorted(ctl.stats()["layers"]),
            "synced": torch.cat(
                [
                    p.detach().reshape(-1)
                    for p in (*model.trunk.parameters(), *model.head.parameters())
                ]
            ),
            "side": _flat(model.side),
        }
        ctl.close()
    return out


def test_parameters_ddp_ignores_are_left_out(tmp_path: Path) -> None:
    """Parameters set aside with ``DDP._set_params_and_buffers_to_ignore_for_model`` never
    reach a comm hook, so they are not in the plan or the statistics (they were planned and
    reported as compressed before); the others train identically on both ranks, and the
    ignored ones stay each rank's own, as plain DDP leaves them."""
    results = run_ranks(_ignored, 2, tmp_path)
    for mode in ("static", "adaptive"):
        expected = ["head.bias", "head.weight", "trunk.bias", "trunk.weight"]
        assert results[0][mode]["plan"] == expected
        assert results[0][mode]["stats"] == expected
        assert torch.equal(results[0][mode]["synced"], results[1][mode]["synced"])
        assert not torch.equal(results[0][mode]["side"], results[1][mode]["side"])


NEWER_OPTIONS: dict[str, dict[str, Any]] = {
    # A layer no rank ever uses is left unreduced (DDP asks that the set never changes).
    "skip_all_reduce_unused_params": {
        "find_unused_parameters": True,
        "skip_all_reduce_unused_params": True,
        "bucket_cap_mb": 0.005,
    },
    "bucket_cap_mb_list": {"bucket_cap_mb": 0.005, "bucket_cap_mb_list": [1, 1]},
    "batched_grad_copy": {"batched_grad_copy": True, "bucket_cap_mb": 0.005},
    "batched_grad_copy+view": {
        "batched_grad_copy": True,
        "gradient_as_bucket_view": True,
        "bucket_cap_mb": 0.005,
    },
}


COMPRESSED = {"trunk.weight": "powersgd:rank=2", "head.weight": "int8", "*": "fp16"}


def _newer_options(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for option, kwargs in NEWER_OPTIONS.items():
        use_side = not kwargs.get("skip_all_reduce_unused_params", False)
        for plan in ("ddp", "none", "every"):
            torch.manual_seed(0)
            model = _BranchyNet()
            ddp = DDP(model, **kwargs)
            ctl = None
            if plan != "ddp":
                ctl = autocomp.wrap(ddp, plan={"*": "none"} if plan == "none" else COMPRESSED)
            losses = _sgd(ddp, STEPS // 2, _classify(rank, ddp, use_side), momentum=0.9)
            if ctl is not None:
                ctl.close()
            out[f"{option}/{plan}"] = {
                "params": _flat(model),
                "losses": losses,
                "side_grad": model.side.weight.grad,
            }
    return out


def test_newer_ddp_options(tmp_path: Path) -> None:
    """DDP's newer options (skipping never-used parameters, per-bucket caps, batched copies
    into the bucket) change how gradients reach the bucket, not what the hook sees: a
    ``none`` plan gives plain DDP's bits, and compressors keep the ranks identical and learn
    as the uncompressed run does. A layer DDP skips stays without a gradient, as without
    autocomp (the hook never sees it)."""
    results = run_ranks(_newer_options, 2, tmp_path)
    for option in NEWER_OPTIONS:
        for result in results:
            ddp, none = result[f"{option}/ddp"], result[f"{option}/none"]
            assert torch.equal(none["params"], ddp["params"]), option
            if option == "skip_all_reduce_unused_params":
                assert ddp["side_grad"] is None and none["side_grad"] is None
        every = [r[f"{option}/every"] for r in results]
        assert torch.equal(every[0]["params"], every[1]["params"]), option
        _assert_learns_like(every[0]["losses"], results[0][f"{option}/none"]["losses"])


class _CheckpointedNet(MultiBucketNet):
    """``fc2`` recomputed in the backward (non-reentrant activation checkpointing): its
    gradient reaches DDP's bucket from inside the recomputation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x.unsqueeze(1))).flatten(1)
        h = torch.relu(self.norm(self.fc1(h)))
        h = checkpoint(lambda t: torch.relu(self.fc2(t)), h, use_reentrant=False)
        h = torch.relu(self.fc3(h))
        return self.head(h)


LOOP_VARIANTS = ("frozen", "clip", "keep_grads", "checkpoint", "zero")
"""Training-loop habits around the backward: a frozen layer, gradient clipping, zeroed (not
freed) gradients, activation checkpointing, and ZeRO-1's sharded optimizer."""


def _loop_variant(rank: int, variant: str, plan: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _CheckpointedNet() if variant == "checkpoint" else MultiBucketNet()
    rules = dict(EVERY_COMPRESSOR_PLAN)
    if variant == "frozen":
        model.conv.requires_grad_(False)  # DDP leaves it out of its buckets
        rules = {k: v for k, v in rules.items() if not k.startswith("conv")}
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    ctl = None
    if plan != "ddp":
        ctl = autocomp.wrap(ddp, plan={"*": "none"} if plan == "none" else rules)
    params = [p for p in ddp.parameters() if p.requires_grad]
    if variant == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt: torch.optim.Optimizer = ZeroRedundancyOptimizer(
            params, optimizer_class=torch.optim.SGD, lr=0.05, momentum=0.9
        )
    else:
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    loss_at = _classify(rank, ddp)
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=variant != "keep_grads")
        loss = loss_at(step)
        loss.backward()
        if variant == "clip":
            nn.utils.clip_grad_norm_(params, max_norm=0.5)
        opt.step()
        losses.append(loss.item())
    if ctl is not None:
        ctl.close()
    return {"params": _flat(model), "losses": losses, "conv": _flat(model.conv)}


def _loop_variants(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    return {
        f"{variant}/{plan}": _loop_variant(rank, variant, plan)
        for variant in LOOP_VARIANTS
        for plan in ("ddp", "none", "every")
    }


def test_training_loop_variants_keep_the_ranks_identical(tmp_path: Path) -> None:
    """What a training loop does around the backward never reaches the hook's contract: with
    a frozen layer (absent from DDP's buckets, so from the plan), gradient clipping after the
    all-reduce, ``zero_grad(set_to_none=False)``, a checkpointed layer and
    ``ZeroRedundancyOptimizer``, a ``none`` plan gives plain DDP's bits, and every compressor
    family keeps the ranks identical and learns as the uncompressed run does (under clipping
    it only has to learn: see below)."""
    results = run_ranks(_loop_variants, 2, tmp_path)
    for variant in LOOP_VARIANTS:
        for result in results:
            ddp, none = result[f"{variant}/ddp"], result[f"{variant}/none"]
            assert torch.equal(none["params"], ddp["params"]), variant
        every = [r[f"{variant}/every"] for r in results]
        assert torch.equal(every[0]["params"], every[1]["params"]), variant
        if variant == "clip":
            # Clipping to a global norm shrinks the step of a plan whose decoded gradient
            # has a larger norm than the gradient (sign, unbiased random-k: 0.979 against
            # 0.879 uncompressed after 40 steps, 0.828 against 0.821 unclipped). That is the
            # compressors' noise meeting the clip, not the hook; the loss still falls.
            losses = every[0]["losses"]
            assert sum(losses[-3:]) < 0.7 * sum(losses[:3]), losses
            continue
        _assert_learns_like(every[0]["losses"], results[0][f"{variant}/none"]["losses"])
    # The frozen layer kept its initial weights under every plan.
    frozen = [r[f"frozen/{plan}"]["conv"] for r in results for plan in ("ddp", "none", "every")]
    trained = results[0]["clip/ddp"]["conv"]  # the same seed's conv where it trains
    assert all(torch.equal(f, frozen[0]) for f in frozen)
    assert not torch.equal(frozen[0], trained)
