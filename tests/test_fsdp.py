"""``autocomp.wrap_fsdp``: compressed replica all-reduce for FSDP2 on a (replicate, shard) mesh.

Tier 1 (pure unit tests, no process group): argument checks, the default plan, payload
packing. Tier 2 (4 local gloo ranks on a 2x2 mesh, ``tests.multirank``): with plan ``none`` the
parameters match FSDP2's native HSDP bit for bit; with compressors (PowerSGD's two rounds,
a gathered topk, an fp16 all-reduce, an empty local shard) every replica of a shard stays
bit-identical, the loss falls over 30 steps, and the bytes sent across the replicate dimension
are exactly what the compressors report; bad input fails with a clear error on every rank; in
adaptive mode the window loop decides (pins applied), measures the link and plans nothing as
hideable (FSDP's hook blocks), and the warm-up ends in every replicate group at the boundary
where one group's look ends it; a parameter one replica does not use is averaged as zero
(bit for bit FSDP2's native HSDP with its unused-parameter setting), and a module every
replica stops running passes the order check, and one skipped on one replica only (equal
sizes, which gloo cannot notice) fails on every rank at the first check; the controller's
state dict round-trips bit-exactly through torch.save and DCP, and another rank's entry is
refused on every rank; a checkpoint of a 2x2 mesh resumes on a 4x1 mesh with its step alone,
through torch.save and DCP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import autocomp
from autocomp.compressors import build_compressor
from autocomp.fsdp import FSDPController
from autocomp.fsdp_setup import DEFAULT_MATRIX_SPEC, check_mesh, default_assignment
from tests.multirank import run_ranks

WORLD = 4
STEPS = 30


# ---- tier 1 -------------------------------------------------------------------------------


def test_needs_an_initialized_process_group() -> None:
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        autocomp.wrap_fsdp(torch.nn.Linear(2, 2), object())  # type: ignore[arg-type]


def test_mesh_must_be_a_device_mesh() -> None:
    with pytest.raises(TypeError, match="DeviceMesh"):
        check_mesh([[0, 1], [2, 3]])


def test_default_plan_compresses_matrices_only() -> None:
    params = dict(
        torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)).named_parameters()
    )
    specs = {name: c.spec for name, c in default_assignment(params).items()}
    powersgd = build_compressor(DEFAULT_MATRIX_SPEC).spec
    assert specs == {"0.weight": powersgd, "0.bias": "none", "1.weight": "none", "1.bias": "none"}


def test_config_defaults() -> None:
    config = FSDPController.Config()
    assert (config.seed, config.warmup_steps, config.broadcast_parameters) == (None, None, True)
    with pytest.raises(TypeError):
        FSDPController.Config(0)  # type: ignore[misc]  # keyword-only


def test_param_groups_read_both_fsdp2_layouts() -> None:
    # torch 2.13 keeps a list of groups; torch 2.11 (the GPU machine's, 2026-11-24) one
    # optional group, and wrap_fsdp failed there with an AttributeError before this.
    from types import SimpleNamespace

    from autocomp.fsdp_setup import _param_groups

    group = object()
    assert _param_groups(SimpleNamespace(_fsdp_param_groups=[group, group])) == [group, group]
    assert _param_groups(SimpleNamespace(_fsdp_param_groups=[])) == []
    assert _param_groups(SimpleNamespace(_fsdp_param_group=group)) == [group]
    assert _param_groups(SimpleNamespace(_fsdp_param_group=None)) == []
    assert _param_groups(SimpleNamespace()) == []


# ---- tier 2: helpers (run inside the ranks) ---------------------------------------


def _mesh() -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))


def _net() -> torch.nn.Module:
    """Two FSDP blocks and a root that keeps the head: 32 -> 1 (an empty shard on rank 1)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 1),
    )


def _shard(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank its own batch of a fixed regression task."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(16, 8, generator=g)
    teacher = torch.linspace(-1.0, 1.0, 8)
    return x, (0.5 * x @ teacher).unsqueeze(1)


def _train(
    model: torch.nn.Module, rank: int, steps: int, lr: float = 0.1, device: str = "cpu"
) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = (t.to(device) for t in _batch(rank, step))
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _local_shards(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().to_local().clone() for n, p in model.named_parameters()}


def _replicas_identical(model: torch.nn.Module, group: Any) -> bool:
    """Whether this rank's shards equal every other replica's of the same shard, bit for bit."""
    flat = torch.cat([p.detach().to_local().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, flat, group=group)
    return all(torch.equal(g.view(torch.int32), flat.view(torch.int32)) for g in gathered)


def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def _exact_and_errors(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh()
    native = _shard(_net(), mesh)  # FSDP2's own HSDP on the 2-D mesh
    native_losses = _train(native, rank, 4)
    ours = _shard(_net(), mesh["shard"])
    ctl = autocomp.wrap_fsdp(ours, mesh, plan={"*": "none"})
    our_losses = _train(ours, rank, 4)
    # The native DTensors live on the 2-D mesh, ours on the shard sub-mesh; the local shards
    # are the same slices.
    same = {
        n: torch.equal(a, b)
        for (n, a), b in zip(
            _local_shards(native).items(), _local_shards(ours).values(), strict=True
        )
    }
    errors = {
        "not_sharded": _error(lambda: autocomp.wrap_fsdp(_net(), mesh)),
        "native_hsdp": _error(lambda: autocomp.wrap_fsdp(_shard(_net(), mesh), mesh)),
        "one_d_mesh": _error(lambda: autocomp.wrap_fsdp(ours, mesh["shard"])),
        "twice": _error(lambda: autocomp.wrap_fsdp(ours, mesh)),
        "bad_spec": _error(lambda: autocomp.wrap_fsdp(ours, mesh, plan={"*": "powersgd:rank=0"})),
        "bad_order_check": _error(
            lambda: autocomp.wrap_fsdp(
                ours, mesh, config=FSDPController.Config(order_check_every=-1)
            )
        ),
    }
    # A parameter FSDP does not manage (ignored_params) would diverge between replicas.
    partial = _net()
    fully_shard(partial, mesh=mesh["shard"], ignored_params=set(partial[4].parameters()))
    errors["ignored"] = _error(lambda: autocomp.wrap_fsdp(partial, mesh))
    # Root-only sharding (the root's reduce runs from FSDP's end-of-backward callback) and
    # gradient accumulation without sync: one counted step per synchronized backward.
    root_only = fully_shard(_net(), mesh=mesh["shard"])
    accum = autocomp.wrap_fsdp(root_only, mesh)
    x, y = _batch(rank, 0)
    root_only.set_requires_gradient_sync(False)
    torch.nn.functional.mse_loss(root_only(x), y).backward()
    root_only.set_requires_gradient_sync(True)
    torch.nn.functional.mse_loss(root_only(x), y).backward()
    return {
        "same": same,
        "native_losses": native_losses,
        "our_losses": our_losses,
        "errors": errors,
        "none_stats": (ctl.bytes_sent, ctl.bytes_raw, ctl.step),
        "accum_step": accum.step,
        "accum_identical": _replicas_identical(root_only, mesh.get_group(0)),
    }


MIXED_PLAN = {
    "0.weight": "powersgd:rank=2",  # shard 16x8: two rounds
    "2.weight": "topk:ratio=0.1",  # gathered
    "4.weight": "powersgd:rank=4",  # 1x32 on shard 0 (sent whole), empty on shard 1
    "*bias": "fp16",  # a float16 all-reduce beside the float32 one
}


def _compressed(rank: int, world: int) -> dict[str, Any]:
    mesh = _mesh()
    model = _shard(_net(), mesh["shard"])
    ctl = autocomp.wrap_fsdp(model, mesh, plan=MIXED_PLAN)
    per_step_wire = sum(
        build_compressor(ctl.plan[n]).wire_bytes(s.shape, s.dtype)
        for n, s in ctl._state.slots.items()
    )
    per_step_raw = sum(s.numel * s.dtype.itemsize for s in ctl._state.slots.values())
    losses = _train(model, rank, STEPS, lr=0.05)
    replicate = mesh.get_group(0)
    identical = _replicas_identical(model, replicate)
    bytes_compressed = (ctl.bytes_sent, ctl.bytes_raw)
    steps = ctl.step
    ctl.close()  # plain averaging from here on
    _train(model, rank, 2, lr=0.05)
    closed = (
        _replicas_identical(model, replicate),
        ctl.bytes_sent - bytes_compressed[0],
        ctl.bytes_raw - bytes_compressed[1],
    )
    # A NaN on one rank's batch: every replica sees the non-finite average and resets.
    poisoned = _shard(_net(), mesh["shard"])
    poisoned_ctl = autocomp.wrap_fsdp(poisoned, mesh)
    for step in range(2):
        x, y = _batch(rank, step)
        if step == 0 and rank == 0:
            x[0, 0] = float("nan")
        torch.nn.functional.mse_loss(poisoned(x), y).backward()
    default = _shard(_net(), mesh["shard"])
    default_ctl = autocomp.wrap_fsdp(default, mesh)
    _train(default, rank, 5, lr=0.05)
    return {
        "losses": losses,
        "identical": identical,
        "bytes": bytes_compressed,
        "closed": closed,
        "nonfinite": poisoned_ctl.nonfinite_events,
        "expected": (STEPS * per_step_wire, STEPS * per_step_raw),
        "step": steps,
        "shapes": {n: tuple(s.shape) for n, s in ctl._state.slots.items()},
        "stats": ctl.stats(),
        "default_identical": _replicas_identical(default, replicate),
        "default_ratio": default_ctl.bytes_raw / default_ctl.bytes_sent,
    }


# ---- tier 2: tests --------------------------------------------------------------------------


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_plan_none_matches_native_hsdp_and_bad_input_fails(tmp_path: Path) -> None:
    results = run_ranks(_exact_and_errors, WORLD, tmp_path, timeout=110)
    for rank, r in enumerate(results):
        # Bit-exact, not just close: averaging two replicas as x/2 + y/2 (ours) or (x + y)/2
        # (FSDP's) rounds identically, since halving is exact in binary floating point.
        assert all(r["same"].values()), (rank, r["same"])
        assert r["our_losses"] == r["native_losses"]
        sent, raw, step = r["none_stats"]
        assert step == 4 and sent == raw > 0
        assert r["accum_step"] == 1 and r["accum_identical"]
        errors = r["errors"]
        assert (
            errors["not_sharded"].startswith("TypeError") and "fully_shard" in errors["not_sharded"]
        )
        assert (
            errors["native_hsdp"].startswith("ValueError")
            and 'mesh["shard"]' in errors["native_hsdp"]
        )
        assert errors["one_d_mesh"].startswith("ValueError") and "2-D" in errors["one_d_mesh"]
        assert errors["twice"].startswith("RuntimeError") and "already wrapped" in errors["twice"]
        assert errors["bad_spec"].startswith("ValueError") and "rank" in errors["bad_spec"]
        assert "order_check_every must be an int >= 0" in errors["bad_order_check"]
        assert errors["ignored"].startswith("ValueError") and "4.weight" in errors["ignored"]


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_compressed_replicas_agree_loss_falls_bytes_exact(tmp_path: Path) -> None:
    results = run_ranks(_compressed, WORLD, tmp_path, timeout=110)
    for rank, r in enumerate(results):
        shard = rank % 2  # mesh[r][s] = 2r + s
        assert r["identical"] and r["default_identical"], rank
        assert r["step"] == STEPS
        assert r["shapes"]["0.weight"] == (16, 8)
        assert r["shapes"]["4.weight"] == ((1, 32) if shard == 0 else (0, 32))
        first, last = sum(r["losses"][:5]) / 5, sum(r["losses"][-5:]) / 5
        assert last < 0.5 * first, r["losses"]
        sent, raw = r["bytes"]
        assert (sent, raw) == r["expected"]
        assert sent < raw
        assert r["default_ratio"] > 1.5
        identical_after_close, sent_after_close, raw_after_close = r["closed"]
        assert identical_after_close and sent_after_close == raw_after_close > 0
        # Step 0's NaN reaches every compressed layer's average (PowerSGD mixes all rows).
        assert (0, "0.weight") in r["nonfinite"] and (0, "2.weight") in r["nonfinite"], r
    # What each shard index sends, from the compressors' own wire_bytes (16x8 PowerSGD rank 2:
    # (16 + 8) * 2 * 4 = 192 bytes of 512; topk 10% of a 16x32 shard: 51 * 8 = 408 of 2048).
    layers = results[0]["stats"]["layers"]
    assert layers["0.weight"]["wire_bytes_per_step"] == 192
    assert layers["2.weight"]["wire_bytes_per_step"] == 408
    assert layers["0.bias"]["wire_bytes_per_step"] == 16 * 2


class _Gated(torch.nn.Module):
    """A block whose second branch runs only when ``use_branch`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Linear(8, 8)
        self.branch = torch.nn.Linear(8, 8)
        self.use_branch = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.trunk(x))
        return y + self.branch(x) if self.use_branch else y


def _gated_net(mesh: Any, branch_module: bool = False) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), _Gated(), torch.nn.Linear(8, 1))
    if branch_module:
        fully_shard(model[1].branch, mesh=mesh)
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[1], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _unused(rank: int, world: int) -> dict[str, Any]:
    """Replica 0 (ranks 0, 1) uses a parameter that replica 1 (ranks 2, 3) does not."""
    mesh = _mesh()
    uses = rank // 2 == 0
    native = _gated_net(mesh)  # FSDP2's own HSDP, told to reduce unused parameters as zeros
    native.set_reduce_scatter_unused_params(True)
    native[1].use_branch = uses
    native_losses = _train(native, rank, 4)
    ours = _gated_net(mesh["shard"])
    ours[1].use_branch = uses
    autocomp.wrap_fsdp(ours, mesh, plan={"*": "none"})
    our_losses = _train(ours, rank, 4)
    same = all(
        torch.equal(a, b)
        for a, b in zip(_local_shards(native).values(), _local_shards(ours).values(), strict=True)
    )
    compressed = _gated_net(mesh["shard"])
    compressed[1].use_branch = uses
    autocomp.wrap_fsdp(compressed, mesh, plan={"*weight": "powersgd:rank=2", "*": "fp16"})
    _train(compressed, rank, 4)
    # Every rank stops running a whole FSDP module from step 2 on: FSDP then reduces it from
    # its end-of-backward callback, last, on every replica alike. Safe: the order checks (at
    # steps 2 and 4) pass.
    skipping = _gated_net(mesh["shard"], branch_module=True)
    skipping_ctl = autocomp.wrap_fsdp(
        skipping,
        mesh,
        plan={"*weight": "powersgd:rank=2"},
        config=FSDPController.Config(order_check_every=2),
    )
    opt = torch.optim.SGD(skipping.parameters(), lr=0.1)
    for step in range(5):
        skipping[1].use_branch = step < 2
        x, y = _batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(skipping(x), y).backward()
        opt.step()
    return {
        "same": same,
        "losses": (native_losses, our_losses),
        "identical": _replicas_identical(compressed, mesh.get_group(0)),
        "skipping_identical": _replicas_identical(skipping, mesh.get_group(0)),
        "skipping_step": skipping_ctl.step,
        "order_checks": skipping_ctl.order_check.checks,
    }


def _has_unused_params_setting() -> bool:
    from torch.distributed.fsdp import FSDPModule

    return hasattr(FSDPModule, "set_reduce_scatter_unused_params")


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.skipif(
    not _has_unused_params_setting(),
    reason="this torch's FSDP2 has no set_reduce_scatter_unused_params (2.11 lacks it)",
)
def test_a_parameter_unused_on_one_replica_is_averaged_as_zero(tmp_path: Path) -> None:
    """Until 2026-11-26 the replica that skipped the parameter raised in the hook (a shorter
    flat buffer) while the other waited in the exchange; wrap_fsdp now has FSDP reduce
    unused parameters as zeros, which is what FSDP's native HSDP does with that setting."""
    results = run_ranks(_unused, WORLD, tmp_path, timeout=110)
    for rank, r in enumerate(results):
        assert r["same"], rank
        assert r["losses"][0] == r["losses"][1], r["losses"]
        assert r["identical"] and r["skipping_identical"], rank
        assert r["skipping_step"] == 5
        assert r["order_checks"] == 2, r


class _EqualBlocks(torch.nn.Module):
    """Three FSDP blocks of one size (72 elements) and a root without parameters: a block
    skipped on one replica only pairs the exchanges wrongly without any size mismatch."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.gated = _Gated()
        self.last = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.gated(torch.tanh(self.first(x)))).sum(dim=1, keepdim=True)


def _skipped_on_one_replica(rank: int, world: int) -> dict[str, Any]:
    """From step 2 on replica 1 (ranks 2, 3) stops running ``gated.branch``, replica 0 goes
    on. FSDP then reduces the branch last on replica 1 only (a module that never ran is not
    reduced at all: the replicas then differ in their number of exchanges, which gloo reports
    as a size mismatch or a hang, and no check between steps can come first)."""
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh()
    torch.manual_seed(0)
    model = _EqualBlocks()
    for block in (model.gated.branch, model.first, model.gated, model.last, model):
        fully_shard(block, mesh=mesh["shard"])
    ctl = autocomp.wrap_fsdp(
        model, mesh, plan={"*": "none"}, config=FSDPController.Config(order_check_every=2)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    error = ""
    for step in range(6):
        model.gated.use_branch = step < 2 or rank // 2 == 0
        x, y = _batch(rank, step)
        opt.zero_grad()
        try:
            torch.nn.functional.mse_loss(model(x), y).backward()
        except RuntimeError as err:
            error = str(err)
            break
        opt.step()
    return {"error": error, "step": ctl.step}


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.skipif(
    not _has_unused_params_setting(),
    reason="this torch's FSDP2 has no set_reduce_scatter_unused_params (2.11 lacks it)",
)
def test_a_module_skipped_on_one_replica_only_fails_on_every_rank(tmp_path: Path) -> None:
    """Equal sizes, so gloo cannot notice: the exchanges average different blocks together.
    Until 2026-11-26 only a rank-local warning said anything (on the replica whose order
    changed). The check at step 2 passes (steps 0 and 1 ran alike); the one at step 4 raises
    on all four ranks."""
    results = run_ranks(_skipped_on_one_replica, WORLD, tmp_path, timeout=110)
    for rank, r in enumerate(results):
        assert "different orders" in r["error"], (rank, r)
        assert r["step"] == 4, (rank, r)


def _adaptive(rank: int, world: int) -> dict[str, Any]:
    mesh = _mesh()
    model = _shard(_net(), mesh["shard"])
    ctl = autocomp.wrap_fsdp(
        model,
        mesh,
        {"2.weight": "topk:ratio=0.1"},  # a pin: the policy must apply it
        target_overlap=0.9,
        window=4,
        config=FSDPController.Config(warmup_steps=4),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(20):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        ctl.observe_loss(loss.detach())
        opt.step()
        losses.append(loss.item())
    assert ctl.adaptive is not None
    history = ctl.history
    result = {
        "mode": ctl.mode,
        "losses": losses,
        "windows": len(history),
        "hideable": [r.hideable_seconds for r in history],
        "comm": [r.comm_busy_seconds for r in history],
        "plan": ctl.plan,
        "identical": _replicas_identical(model, mesh.get_group(0)),
    }
    # The adaptive state resumes on a fresh controller: plan, step, loop and planner.
    state = ctl.state_dict()
    fresh = autocomp.wrap_fsdp(
        _shard(_net(), mesh["shard"]),
        mesh,
        {"2.weight": "topk:ratio=0.1"},
        target_overlap=0.9,
        window=4,
        config=FSDPController.Config(warmup_steps=4),
    )
    fresh.load_state_dict(state)
    assert fresh.adaptive is not None
    result["resumed"] = (
        fresh.plan == ctl.plan,
        fresh.step == ctl.step,
        fresh.adaptive.planner.warmup_done == ctl.adaptive.planner.warmup_done,
        fresh.adaptive.planner.rel_errors == ctl.adaptive.planner.rel_errors,
    )
    ctl.close()
    return result


@pytest.mark.multirank
@pytest.mark.timeout(180)
def test_adaptive_policy_decides_for_fsdp(tmp_path: Path) -> None:
    results = run_ranks(_adaptive, WORLD, tmp_path, timeout=170)
    for rank, r in enumerate(results):
        assert r["mode"] == "adaptive" and r["identical"], rank
        assert r["resumed"] == (True, True, True, True), (rank, r["resumed"])
        assert r["windows"] >= 3, r
        # FSDP's hook blocks: nothing is hideable, and the link was measured.
        assert all(h == 0.0 for h in r["hideable"]), r["hideable"]
        assert any(c > 0 for c in r["comm"]), r["comm"]
        assert r["plan"]["2.weight"].startswith("topk:ratio=0.1"), r["plan"]
        first, last = sum(r["losses"][:5]) / 5, sum(r["losses"][-5:]) / 5
        assert last < 0.5 * first, r["losses"]


def _warmup_agreed(rank: int, world: int, failing: bool) -> dict[str, Any]:
    """Replicate group {0, 2} reads a communication-bound step at the look at step 2; group
    {1, 3} never does (both planners' readings are fixed, so the test does not depend on
    this machine's timings). ``failing``: group {1, 3}'s planner also raises at step 2, in
    its warm-up check and in its decision (rank-local failures the loop must survive)."""
    mesh = _mesh()
    model = _shard(_net(), mesh["shard"])
    ctl = autocomp.wrap_fsdp(
        model, mesh, target_overlap=0.9, window=8, config=FSDPController.Config(warmup_steps=40)
    )
    assert ctl.adaptive is not None
    planner = ctl.adaptive.planner
    if rank == 0:
        planner._dominance = lambda m: 3.0 if m.step == 2 else None  # type: ignore[method-assign]
    else:
        planner._dominance = lambda m: None  # type: ignore[method-assign]
    if failing and rank == 1:
        decide = planner.decide

        def broken(m: Any, *args: Any, **kwargs: Any) -> Any:
            if m.step == 2:
                raise RuntimeError("injected decision failure")
            return decide(m, *args, **kwargs)

        def broken_check(m: Any) -> bool:
            raise RuntimeError("injected warm-up check failure")

        planner.decide = broken  # type: ignore[method-assign]
        planner.ends_warmup = broken_check  # type: ignore[method-assign]
    warming = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(12):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        warming.append(ctl.adaptive._warming)
    result = {
        "warming": warming,
        "decider_done": planner.warmup_done if dist.get_rank(mesh.get_group(0)) == 0 else None,
        "boundaries": [r.step for r in ctl.history],
        "identical": _replicas_identical(model, mesh.get_group(0)),
        "shared_schedule": planner.shared_schedule,
    }
    ctl.close()
    return result


@pytest.mark.multirank
@pytest.mark.timeout(180)
@pytest.mark.parametrize("failing", [False, True])
def test_the_warm_up_ends_in_every_replicate_group_when_one_ends_it(
    tmp_path: Path, failing: bool
) -> None:
    """Each replicate group decides for its own shards, but the step is one: a group left
    warming up would hold the others to its uncompressed pace. Both deciding ranks end the
    warm-up at step 2, and every rank keeps the same boundary schedule (a mismatch would
    hang the shard group's agreement), also when the other group's planner raises there."""
    results = run_ranks(_warmup_agreed, WORLD, tmp_path, failing, timeout=170)
    for rank, r in enumerate(results):
        # The flag after each step's backward: the boundary at step 2 ran in step index 2.
        assert r["warming"] == [True, True] + [False] * 10, (rank, r["warming"])
        assert r["decider_done"] in (True, None), (rank, r)
        assert r["boundaries"] == [1, 2, 4, 8], (rank, r["boundaries"])
        assert r["identical"], rank
        # Peer loops keep one schedule: no planner may ask for a short window, nor resume
        # the warm-up (its flag sets the early looks).
        assert r["shared_schedule"] is True, rank
    assert [r["decider_done"] for r in results] == [True, True, None, None]


def _residuals(ctl: FSDPController) -> dict[str, torch.Tensor | None]:
    return {
        n: None if s.residual is None else s.residual.clone() for n, s in ctl._state.slots.items()
    }


def _same_residuals(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def same(x: torch.Tensor | None, y: torch.Tensor | None) -> bool:
        if x is None or y is None:
            return x is None and y is None
        return torch.equal(x, y)

    return a.keys() == b.keys() and all(same(x, b[n]) for n, x in a.items())


def _resumed(
    mesh: Any, shards: dict[str, torch.Tensor], load: Any
) -> tuple[torch.nn.Module, FSDPController]:
    """A fresh model on ``mesh``'s shard dimension holding ``shards`` (its local shards),
    wrapped with :data:`MIXED_PLAN`, then ``load(controller)``."""
    other = _shard(_net(), mesh["shard"])
    with torch.no_grad():
        for name, param in other.named_parameters():
            param.to_local().copy_(shards[name])
    other_ctl = autocomp.wrap_fsdp(other, mesh, plan=MIXED_PLAN)
    load(other_ctl)
    return other, other_ctl


def _checkpoint(rank: int, world: int, path: str) -> dict[str, Any]:
    """Save after 3 compressed steps (torch.save and DCP), resume on fresh models, and run on
    side by side; then the refusals."""
    import io

    import torch.distributed.checkpoint as dcp

    mesh = _mesh()
    model = _shard(_net(), mesh["shard"])
    ctl = autocomp.wrap_fsdp(model, mesh, plan=MIXED_PLAN)
    fresh_template = autocomp.wrap_fsdp(_shard(_net(), mesh["shard"]), mesh, plan=MIXED_PLAN)
    template = fresh_template.state_dict()  # before any step: every residual allocated
    _train(model, rank, 3, lr=0.05)
    saved = io.BytesIO()
    torch.save(ctl.state_dict(), saved)
    dcp.save({"ac": ctl}, checkpoint_id=path)
    shards = _local_shards(model)

    def resumed(load: Any) -> tuple[torch.nn.Module, FSDPController]:
        return _resumed(mesh, shards, load)

    saved.seek(0)
    state = torch.load(saved, weights_only=False)
    from_file, file_ctl = resumed(lambda c: c.load_state_dict(state))
    from_dcp, dcp_ctl = resumed(lambda c: dcp.load({"ac": c}, checkpoint_id=path))
    restored = (
        _same_residuals(_residuals(ctl), _residuals(file_ctl)),
        _same_residuals(_residuals(ctl), _residuals(dcp_ctl)),
        file_ctl.step == dcp_ctl.step == ctl.step == 3,
    )

    def run_on(m: torch.nn.Module) -> dict[str, torch.Tensor]:
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for step in range(3, 5):
            x, y = _batch(rank, step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        return _local_shards(m)

    reference = run_on(model)
    continued = [
        all(torch.equal(a, b) for a, b in zip(reference.values(), run_on(m).values(), strict=True))
        for m in (from_file, from_dcp)
    ]
    # Rank 0 alone loads rank 1's entry: it refuses, and every rank raises with it.
    wrong = dict(state)
    if rank == 0:
        wrong = {**{k: v for k, v in state.items() if not k.startswith("rank")}, "rank1": {}}
    refusal = _error(lambda: file_ctl.load_state_dict(wrong))
    return {
        "template": sorted(template[f"rank{rank}"]["residual"]),
        "template_tensors": all(
            isinstance(v, torch.Tensor) for v in template[f"rank{rank}"]["residual"].values()
        ),
        "restored": restored,
        "continued": continued,
        "refusal": refusal,
        "replicas": _replicas_identical(from_dcp, mesh.get_group(0)),
    }


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_checkpoint_round_trips_with_torch_save_and_dcp(tmp_path: Path) -> None:
    """Each rank's residuals and compressor state come back bit-exactly through torch.save
    and through torch.distributed.checkpoint (entries namespaced by global rank: four ranks,
    two replicas of two shards), and training continues exactly as without the interruption.
    A rank handed another rank's entry refuses, and every rank raises with it."""
    results = run_ranks(_checkpoint, WORLD, tmp_path, str(tmp_path / "dcp"), timeout=140)
    for rank, r in enumerate(results):
        assert r["template_tensors"] and r["template"], rank
        assert r["restored"] == (True, True, True), (rank, r["restored"])
        assert r["continued"] == [True, True], (rank, r["continued"])
        assert r["replicas"], rank
        if rank == 0:
            assert r["refusal"].startswith("ValueError") and "not rank0" in r["refusal"]
        else:
            assert r["refusal"].startswith("RuntimeError") and "another rank" in r["refusal"]


def _remesh(rank: int, world: int, path: str) -> dict[str, Any]:
    """Train 3 compressed steps on a 2x2 mesh and save; resume on a 4x1 mesh (torch.save and
    DCP) and train on."""
    import io
    import logging

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.device_mesh import init_device_mesh

    mesh = _mesh()
    model = _shard(_net(), mesh["shard"])
    ctl = autocomp.wrap_fsdp(model, mesh, plan=MIXED_PLAN)
    _train(model, rank, 3, lr=0.05)
    had_residuals = any(s.residual is not None for s in ctl._state.slots.values())
    saved = io.BytesIO()
    torch.save(ctl.state_dict(), saved)
    dcp.save({"ac": ctl}, checkpoint_id=path)
    full = {n: p.detach().full_tensor() for n, p in model.named_parameters()}

    wide = init_device_mesh("cpu", (4, 1), mesh_dim_names=("replicate", "shard"))
    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    handler = Collect(level=logging.WARNING)
    logging.getLogger("autocomp.checkpoint").addHandler(handler)

    def resumed(load: Any) -> tuple[torch.nn.Module, FSDPController]:
        return _resumed(wide, full, load)  # shard size 1: the local shard is the parameter

    saved.seek(0)
    state = torch.load(saved, weights_only=False)
    from_file, file_ctl = resumed(lambda c: c.load_state_dict(state))
    planner = autocomp.ElasticLoadPlanner("ac")
    from_dcp, dcp_ctl = resumed(lambda c: dcp.load({"ac": c}, checkpoint_id=path, planner=planner))
    # DCP's default planner refuses the reshaped residuals; the elastic one leaves out this
    # rank's residuals and nothing else.
    try:  # DCP raises CheckpointException, a BaseException
        resumed(lambda c: dcp.load({"ac": c}, checkpoint_id=path, planner=DefaultLoadPlanner()))
        strict = "no error"
    except BaseException as err:
        strict = f"{type(err).__name__}: {err}"
    skipped = sorted({key.split(".")[2] for key in planner.skipped})
    logging.getLogger("autocomp.checkpoint").removeHandler(handler)
    results = {}
    for label, resumed_model, resumed_ctl in (
        ("file", from_file, file_ctl),
        ("dcp", from_dcp, dcp_ctl),
    ):
        fresh = all(s.residual is None for s in resumed_ctl._state.slots.values())
        step = resumed_ctl.step
        losses = _train(resumed_model, rank, 4, lr=0.05)
        results[label] = {
            "step": step,
            "fresh": fresh,
            "trained": resumed_ctl.step,
            "finite": all(torch.isfinite(torch.tensor(losses))),
            "replicas": _replicas_identical(resumed_model, wide.get_group(0)),
        }
    return {
        "had_residuals": had_residuals,
        "warnings": warnings,
        "strict": strict,
        "skipped": skipped,
        **results,
    }


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_checkpoint_of_another_mesh_resumes_its_step(tmp_path: Path) -> None:
    """A 2x2-mesh checkpoint loads on a 4x1 mesh, from torch.save and from DCP (with
    ``autocomp.ElasticLoadPlanner``; DCP's default planner refuses the reshaped residuals):
    the step carries over, residuals and warm starts start afresh (they are slices of one
    shard of one replica), rank 0 warns, and training goes on with the four replicas
    bit-identical."""
    results = run_ranks(_remesh, WORLD, tmp_path, str(tmp_path / "dcp"), timeout=140)
    for rank, r in enumerate(results):
        assert r["had_residuals"], rank
        for label in ("file", "dcp"):
            got = r[label]
            assert got["step"] == 3 and got["trained"] == 7, (rank, label, got)
            assert got["fresh"] and got["finite"] and got["replicas"], (rank, label, got)
        assert "Size mismatch" in r["strict"], r["strict"]
        assert r["skipped"] == ["residual"], (rank, r["skipped"])
        warned = [m for m in r["warnings"] if "2x2 mesh" in m and "4x1 mesh" in m]
        assert len(warned) == (2 if rank == 0 else 0), (rank, r["warnings"])
