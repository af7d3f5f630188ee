"""Tier 2: ``autocomp.wrap`` input checking and checkpointing on local gloo ranks.

Every bad input gets a clear error, raised on every rank and never a hang: a model that is
not DDP, wrapping twice, a foreign comm hook (also on one rank only, and the one DDP's
``mixed_precision`` option registers), bad specs, globs that match nothing, and plans
or seeds that differ between ranks. ``state_dict``/``load_state_dict`` resume training
bit-identically, refuse state from another rank or plan (on every rank), and resume at
another world size with residuals started afresh.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.parallel.distributed import _MixedPrecision

import autocomp
from tests.models import MultiBucketNet, classification_batch
from tests.multirank import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]


def test_non_ddp_model_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"DistributedDataParallel.*DistributedDataParallel\(model"):
        autocomp.wrap(nn.Linear(3, 3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got str"):
        autocomp.wrap("model")  # type: ignore[arg-type]


def _error_of(fn: Any) -> str:
    try:
        fn()
    except Exception as err:  # the test inspects type and message
        return f"{type(err).__name__}: {err}"
    return "no error"


def _bad_inputs(rank: int, world_size: int, plan_path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    ddp = DDP(MultiBucketNet())
    out["bad_name"] = _error_of(lambda: autocomp.wrap(ddp, plan={"*": "zip"}))
    out["bad_param"] = _error_of(lambda: autocomp.wrap(ddp, plan={"*": "topk:ratio=2"}))
    out["bad_type"] = _error_of(lambda: autocomp.wrap(ddp, plan=42))  # type: ignore[arg-type]
    out["missing_file"] = _error_of(lambda: autocomp.wrap(ddp, plan="/nonexistent/plan.json"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctl = autocomp.wrap(ddp, plan=plan_path)
    out["warnings"] = " | ".join(str(w.message) for w in caught)
    out["plan_from_file"] = json.dumps(ctl.plan)
    out["twice"] = _error_of(lambda: autocomp.wrap(ddp))

    other = DDP(MultiBucketNet())
    other.register_comm_hook(None, default_hooks.allreduce_hook)
    out["foreign_hook"] = _error_of(lambda: autocomp.wrap(other))
    # A hook on one rank only must still fail on both, before the ranks part ways.
    one_sided = DDP(MultiBucketNet())
    if rank == 0:
        one_sided._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    out["one_sided_hook"] = _error_of(lambda: autocomp.wrap(one_sided))
    # DDP's mixed_precision reduces through a hook of its own, registered by its constructor.
    half = _MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    out["ddp_mixed_precision"] = _error_of(
        lambda: autocomp.wrap(DDP(MultiBucketNet(), mixed_precision=half))
    )

    # Rank-dependent plans and seeds must fail on every rank, not turn into a size mismatch.
    spec = "topk:ratio=0.1" if rank == 0 else "topk:ratio=0.2"
    out["plan_mismatch"] = _error_of(lambda: autocomp.wrap(DDP(MultiBucketNet()), plan={"*": spec}))
    out["seed_mismatch"] = _error_of(lambda: autocomp.wrap(DDP(MultiBucketNet()), seed=rank))
    # After those refusals the ranks still agree and can train: nothing is left half-issued.
    model = MultiBucketNet()
    ok = autocomp.wrap(DDP(model), plan={"*.weight": "int8"})
    x, y = classification_batch(rank, 0)
    torch.nn.functional.cross_entropy(ok.model(x), y).backward()
    out["trained_after_errors"] = str(ok.step)
    return out


def test_bad_inputs_get_clear_errors_on_every_rank(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(
        json.dumps(
            {
                "version": 1,
                "default": "none",
                "rules": [
                    {"match": "fc*.weight", "compressor": "powersgd:rank=2"},
                    {"match": "encoder.*", "compressor": "fp16"},
                ],
            }
        )
    )
    results = run_ranks(_bad_inputs, 2, tmp_path / "ranks", str(plan_path))
    for rank, out in enumerate(results):
        assert out["bad_name"].startswith("ValueError") and "valid:" in out["bad_name"]
        assert "powersgd" in out["bad_name"] and "'zip'" in out["bad_name"]
        assert out["bad_param"].startswith("ValueError") and "out of range" in out["bad_param"]
        assert out["bad_type"].startswith("TypeError")
        assert (
            out["missing_file"].startswith("ValueError") and "does not exist" in out["missing_file"]
        )
        assert "'encoder.*' matches no parameter" in out["warnings"]
        plan = json.loads(out["plan_from_file"])
        assert plan["fc1.weight"] == "powersgd:rank=2,ef=true" and plan["fc1.bias"] == "none"
        assert out["twice"].startswith("RuntimeError") and "already wrapped" in out["twice"]
        assert out["foreign_hook"].startswith("RuntimeError") and "comm hook" in out["foreign_hook"]
        assert "(allreduce_hook)" in out["foreign_hook"]
        one_sided = out["one_sided_hook"]
        assert one_sided.startswith("RuntimeError"), one_sided
        expected = "(BuiltinCommHookType.FP16_COMPRESS)" if rank == 0 else "on another rank"
        assert expected in one_sided, one_sided
        mixed = out["ddp_mixed_precision"]
        assert mixed.startswith("RuntimeError") and "mixed_precision=" in mixed, mixed
        assert "torch.autocast" in mixed
        for key in ("plan_mismatch", "seed_mismatch"):
            assert out[key].startswith("RuntimeError"), (rank, key, out[key])
            assert "differs between ranks" in out[key] and "[1]" in out[key]
        assert out["trained_after_errors"] == "1"


RESUME_PLAN = {
    "conv.weight": "sign",
    "fc1.weight": "powersgd:rank=2",
    "fc2.weight": "topk:ratio=0.05",
    "fc3.weight": "qsgd:levels=4",
    "head.weight": "randomk:ratio=0.3",
    "*.bias": "fp16",
    "norm.*": "powersgd:rank=2",  # 1-D: the hook runs these as 'none'
}
RESUME_AT, RESUME_TOTAL = 7, 14


def _fresh(init_seed: int) -> tuple[nn.Module, DDP, torch.optim.Optimizer, autocomp.Controller]:
    torch.manual_seed(init_seed)
    model = MultiBucketNet()
    ddp = DDP(model, bucket_cap_mb=0.02)
    ctl = autocomp.wrap(ddp, plan=RESUME_PLAN)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    return model, ddp, opt, ctl


def _steps(rank: int, ddp: DDP, opt: torch.optim.Optimizer, start: int, stop: int) -> None:
    for step in range(start, stop):
        x, y = classification_batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()


def _resume(rank: int, world_size: int, ckpt_dir: str) -> dict[str, Any]:
    model, ddp, opt, _ = _fresh(0)
    _steps(rank, ddp, opt, 0, RESUME_TOTAL)
    uninterrupted = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    model, ddp, opt, ctl = _fresh(0)
    _steps(rank, ddp, opt, 0, RESUME_AT)
    path = Path(ckpt_dir) / f"rank{rank}.pt"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "ac": ctl.state_dict()}, path)
    del model, ddp, opt, ctl

    model, ddp, opt, ctl = _fresh(123)  # different init: everything must come from the file
    saved = torch.load(path, weights_only=False)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    ctl.load_state_dict(saved["ac"])
    assert ctl.step == RESUME_AT
    _steps(rank, ddp, opt, RESUME_AT, RESUME_TOTAL)
    resumed = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    errors = {}
    # Another rank's file: its entry is namespaced by that rank.
    mine = saved["ac"][f"rank{rank}"]
    other_rank = {k: v for k, v in saved["ac"].items() if k != f"rank{rank}"}
    other_rank[f"rank{1 - rank}"] = dict(mine, rank=1 - rank)
    errors["rank"] = _error_of(lambda: ctl.load_state_dict(other_rank))
    tampered = dict(saved["ac"], **{f"rank{rank}": dict(mine, rank=1 - rank)})
    errors["entry"] = _error_of(lambda: ctl.load_state_dict(tampered))
    plan = json.loads(saved["ac"]["plan"])
    changed = dict(saved["ac"], plan=json.dumps(dict(plan, **{"fc2.weight": "int8"})))
    errors["plan"] = _error_of(lambda: ctl.load_state_dict(changed))
    errors["foreign"] = _error_of(lambda: ctl.load_state_dict({"weights": 1}))
    # Saved before PowerSGD's 1-D tensors ran as 'none': the plan names PowerSGD for them.
    legacy = dict(plan, **{"norm.weight": "powersgd:rank=2,ef=true"})
    errors["legacy"] = _error_of(
        lambda: ctl.load_state_dict(dict(saved["ac"], plan=json.dumps(legacy)))
    )
    # Another world size is not an error: plan and step carry over, residuals start afresh.
    ctl.load_state_dict(dict(saved["ac"], world_size=8))
    residuals_after_world_change = [s.residual for s in ctl._state.slots.values()]
    return {
        "uninterrupted": uninterrupted,
        "resumed": resumed,
        "errors": errors,
        "dropped": all(r is None for r in residuals_after_world_change),
        "step": ctl.step,
    }


class SparseEmbeddingNet(nn.Module):
    """A bag of tokens through an embedding with ``sparse=True`` (a recommender's shape), then
    dense layers: DDP hands the embedding's gradient to the hook as a sparse tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(512, 32, sparse=True)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(self.emb(tokens).mean(1))))


def _sparse_run(rank: int, plan: dict[str, str] | None, adaptive: bool) -> dict[str, Any]:
    from autocomp.probe_runner import ProbeRunner

    probed: list[int] = []
    probe = ProbeRunner.opening

    def recording(self: ProbeRunner, raw_bytes: int, *args: Any, **kwargs: Any) -> Any:
        probed.append(raw_bytes)  # the gradient bytes the opening weighs the link against
        return probe(self, raw_bytes, *args, **kwargs)

    ProbeRunner.opening = recording  # type: ignore[method-assign]
    try:
        return _sparse_steps(rank, plan, adaptive, probed)
    finally:
        ProbeRunner.opening = probe  # type: ignore[method-assign]


def _sparse_steps(
    rank: int, plan: dict[str, str] | None, adaptive: bool, probed: list[int]
) -> dict[str, Any]:
    torch.manual_seed(0)
    ddp = DDP(SparseEmbeddingNet())
    ctl = None
    if plan is not None or adaptive:
        ctl = autocomp.wrap(ddp, plan=plan, window=3, warmup_steps=2, run_dir=False)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(8):
        tokens = torch.randint(0, 512, (16, 6), generator=generator)
        labels = torch.randint(0, 10, (16,), generator=generator)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(tokens), labels).backward()
        opt.step()
    out: dict[str, Any] = {"emb": ddp.module.emb.weight.detach().clone()}
    out["params"] = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    if ctl is not None:
        out["plan"] = dict(ctl.plan)
        out["sparse_bytes"] = ctl.stats()["layers"]["emb.weight"]["bytes_sent"]
        # An operator's override may still ask for a compressor: the hook state refuses it.
        ctl._state.assign({"emb.weight": autocomp.build_compressor("powersgd:rank=2")})
        out["after_override"] = ctl.plan["emb.weight"]
        if ctl.adaptive is not None:  # rank 0 decides: its engine priced the rows it sent
            out["priced"] = ctl.adaptive.planner.sparse_bytes.get("emb.weight")
            out["opening_bytes"] = probed
        ctl.close()
    return out


def _sparse_gradients(rank: int, world_size: int) -> dict[str, Any]:
    plain = _sparse_run(rank, None, adaptive=False)
    static = _sparse_run(rank, {"fc1.weight": "powersgd:rank=2"}, adaptive=False)
    uncompressed = _sparse_run(rank, {"*": "none"}, adaptive=False)
    adaptive = _sparse_run(rank, None, adaptive=True)
    pinned = _error_of(
        lambda: autocomp.wrap(DDP(SparseEmbeddingNet()), plan={"*.weight": "powersgd:rank=2"})
    )
    two_level = _error_of(lambda: autocomp.wrap(DDP(SparseEmbeddingNet()), hierarchy=True))
    return {
        "plain": plain,
        "static": static,
        "uncompressed": uncompressed,
        "adaptive": adaptive,
        "pinned": pinned,
        "two_level": two_level,
    }


def test_sparse_embedding_gradients_are_sent_as_ddp_sends_them(tmp_path: Path) -> None:
    """``nn.Embedding(sparse=True)`` gives DDP a sparse gradient, alone in its bucket. The hook
    all-reduces it as DDP does and never compresses it: an all-``none`` plan trains exactly
    like plain DDP, a plan compressing a dense layer beside it trains with the embedding's
    average intact on every rank, and adaptive mode keeps it on ``none`` even when asked
    otherwise. A plan that would compress it, or ``hierarchy=True``, is a clear error on
    every rank. (Before, the hook crashed mid-backward slicing the sparse tensor.)"""
    zero, one = run_ranks(_sparse_gradients, 2, tmp_path / "ranks")
    for out in (zero, one):
        assert torch.allclose(out["uncompressed"]["params"], out["plain"]["params"], atol=1e-6)
        assert out["static"]["plan"]["fc1.weight"].startswith("powersgd")
        assert out["static"]["plan"]["emb.weight"] == "none"
        assert out["adaptive"]["plan"]["emb.weight"] == "none"
    # A step's 16 x 6 tokens give 96 rows of 32 floats and 96 int64 indices: 13 kB, where the
    # dense table is 64 KiB. The engine prices the last step's; the hook counts every step's.
    rows = 16 * 6 * (32 * 4 + 8)
    assert zero["adaptive"]["priced"] == rows
    # The opening, before any row is known, weighs the dense layers alone (fc1, fc2).
    assert zero["adaptive"]["opening_bytes"] == [4 * (64 * 32 + 64 + 10 * 64 + 10)]
    for out in (zero, one):
        for run in ("static", "uncompressed", "adaptive"):
            assert out[run]["after_override"] == "none"
            assert out[run]["sparse_bytes"] == 8 * rows
        assert out["pinned"].startswith("ValueError") and "sparse gradients" in out["pinned"]
        assert "emb.weight" in out["pinned"]
        assert out["two_level"].startswith("ValueError") and "hierarchy=False" in out["two_level"]
    for run in ("plain", "static", "uncompressed", "adaptive"):
        assert torch.equal(zero[run]["params"], one[run]["params"]), run
    # The compressed dense layer changes the trajectory, not the embedding's averaging:
    # rows no rank ever touched keep their initial values in every run.
    untouched = (zero["plain"]["emb"] == zero["static"]["emb"]).all(dim=1)
    assert untouched.any()


def _freed_when_dropped(rank: int, world_size: int) -> dict[str, bool]:
    import gc
    import weakref

    freed: dict[str, bool] = {}
    for mode in ("static", "adaptive", "make_hook"):
        torch.manual_seed(0)
        ddp = DDP(MultiBucketNet())
        if mode == "static":
            ctl = autocomp.wrap(ddp, plan={"*": "int8"}, run_dir=False)
        elif mode == "adaptive":
            ctl = autocomp.wrap(ddp, target_overlap=0.9, run_dir=False)
        else:  # a framework's comm-hook slot: the state binds at the first backward
            state, hook = autocomp.make_hook(autocomp.AutocompConfig(target_overlap=0.9))
            ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        _steps(rank, ddp, opt, 0, 3)
        if mode == "make_hook":
            ctl = state.controller
            del state, hook  # what a framework drops with its strategy
        model_ref, controller_ref = weakref.ref(ddp), weakref.ref(ctl)
        del ddp, ctl, opt
        gc.collect()
        freed[mode] = model_ref() is None and controller_ref() is None
    return freed


def test_a_dropped_model_is_freed_without_close(tmp_path: Path) -> None:
    """Once the user drops the model and its controller (no ``close()``), a collection frees
    them. The window loop used to hold the model while DDP's C++ reducer held the loop (hook
    state -> step listener), and ``make_hook``'s state held its controller, which holds the
    model: cycles the collector cannot see into, so the model, its buckets and its reducer
    lived until the process exited."""
    for freed in run_ranks(_freed_when_dropped, 2, tmp_path):
        assert freed == {"static": True, "adaptive": True, "make_hook": True}


def _copies(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    import copy
    import io

    out: dict[str, dict[str, Any]] = {}
    for how in ("wrap", "make_hook", "make_hook_bound_to_module"):
        torch.manual_seed(0)
        module = MultiBucketNet()
        ddp = DDP(module)
        plan = {"*": "int8"}
        if how == "wrap":
            ctl = autocomp.wrap(ddp, plan=plan, run_dir=False)
        else:
            state, hook = autocomp.make_hook(autocomp.AutocompConfig(plan=plan, run_dir=False))
            if how == "make_hook_bound_to_module":
                state.bind(module)  # an EMA copy of this module must not carry a controller
            ddp.register_comm_hook(state, hook)
        _steps(rank, ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), 0, 2)
        if how != "wrap":
            ctl = state.controller
        buffer = io.BytesIO()
        torch.save(ddp, buffer)
        buffer.seek(0)
        copies = {
            "deepcopy(ddp)": copy.deepcopy(ddp),
            "deepcopy(module)": copy.deepcopy(module),
            "torch.save(ddp)": torch.load(buffer, weights_only=False),
        }
        carried = {
            name: getattr(c, "_autocomp_controller", None) is not None
            or getattr(getattr(c, "module", None), "_autocomp_controller", None) is not None
            for name, c in copies.items()
        }
        # A DDP copy has no comm hook (PyTorch registers none on a copy): wrap it again.
        again = autocomp.wrap(copies["deepcopy(ddp)"], plan=plan, run_dir=False)
        x, y = classification_batch(rank, 5)
        torch.nn.functional.cross_entropy(copies["deepcopy(ddp)"](x), y).backward()
        out[how] = {"carried": carried, "again": again.plan, "original": ctl.plan}
    return out


def test_copies_of_a_wrapped_model_carry_no_controller(tmp_path: Path) -> None:
    """``copy.deepcopy`` and ``torch.save`` of a wrapped DDP model work as they do for plain
    DDP (they failed on the process group autocomp's state holds), and neither a copy of the
    DDP model nor of its module (an EMA copy) drags the controller along; a DDP copy, hookless
    as PyTorch makes it, can be wrapped again."""
    for out in run_ranks(_copies, 2, tmp_path):
        for how, result in out.items():
            assert result["carried"] == {
                "deepcopy(ddp)": False,
                "deepcopy(module)": False,
                "torch.save(ddp)": False,
            }, how
            assert set(result["again"].values()) == {"int8:chunk=256,ef=true"}, how
            assert result["again"] == result["original"], how


def test_resume_is_bit_identical(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    results = run_ranks(_resume, 2, tmp_path / "ranks", str(ckpt))
    for out in results:
        assert torch.equal(out["uninterrupted"], out["resumed"])
        errors = out["errors"]
        assert errors["rank"].startswith("ValueError") and "load each rank's own" in errors["rank"]
        assert errors["entry"].startswith("ValueError") and "rank=" in errors["entry"]
        assert errors["plan"].startswith("ValueError") and "fc2.weight" in errors["plan"]
        assert errors["foreign"].startswith("ValueError")
        assert errors["legacy"] == "no error"
        assert out["dropped"] and out["step"] == RESUME_AT
    assert not torch.equal(results[0]["resumed"], torch.zeros_like(results[0]["resumed"]))


def _resume_without_state(rank: int, world_size: int, ckpt_dir: str) -> bool:
    """Control: restoring model and optimizer but not autocomp's state does NOT match."""
    model, ddp, opt, _ = _fresh(0)
    _steps(rank, ddp, opt, 0, RESUME_TOTAL)
    uninterrupted = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    model, ddp, opt, _ = _fresh(0)
    _steps(rank, ddp, opt, 0, RESUME_AT)
    saved = {"model": model.state_dict(), "opt": opt.state_dict()}
    model, ddp, opt, _ = _fresh(0)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    _steps(rank, ddp, opt, RESUME_AT, RESUME_TOTAL)
    resumed = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return bool(torch.equal(uninterrupted, resumed))


def test_resume_without_autocomp_state_differs(tmp_path: Path) -> None:
    assert run_ranks(_resume_without_state, 2, tmp_path, str(tmp_path)) == [False, False]


@pytest.mark.parametrize(("preset", "expected"), [(None, "AUTO"), ("COMPATIBLE", "COMPATIBLE")])
def test_import_pins_mkl_to_one_code_path_unless_set(preset: str | None, expected: str) -> None:
    """MKL's default code-path choice gave ranks different bits for identical PowerSGD decodes
    (test_powersgd_on_many_buckets_keeps_collective_order failed one run in six); importing
    autocomp sets MKL_CBWR=AUTO before MKL first runs, and keeps a value the user set."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if preset is not None:
        env["MKL_CBWR"] = preset
    code = "import os, autocomp; print(os.environ['MKL_CBWR'])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == expected
