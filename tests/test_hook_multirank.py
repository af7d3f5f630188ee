"""Tier 2: the unified comm hook on 2 and 4 local gloo ranks (``tests.multirank``).

Covers: every compressor keeps all ranks bit-identical and the loss falls, on a model whose
gradients span several DDP buckets (2 ranks); all compressors mixed in one model (2 and 4
ranks); PowerSGD on every bucket at 4 ranks (the case where PyTorch's own hook aborts on
gloo); the bytes handed to the collectives equal what the compressors report; close() falls
back to plain all-reduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from tests.models import EVERY_COMPRESSOR_PLAN, MultiBucketNet, classification_batch
from tests.multirank import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

ALL_SPECS = [
    "none",
    "fp16",
    "bf16",
    "int8",
    "qsgd:levels=8",
    "sign",
    "topk:ratio=0.05",
    "randomk:ratio=0.25",
    "powersgd:rank=2",
]
BUCKET_CAP_MB = 0.02  # ~5k floats per bucket: MultiBucketNet spreads over >= 3 buckets
STEPS = 40


def _flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _train(
    rank: int,
    plan: dict[str, str] | list[tuple[str, str]],
    steps: int = STEPS,
    lr: float = 0.05,
    bucket_view: bool = False,
) -> dict[str, Any]:
    torch.manual_seed(0)
    model = MultiBucketNet()
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB, gradient_as_bucket_view=bucket_view)
    ctl = autocomp.wrap(ddp, plan=plan)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = classification_batch(rank, step)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    buckets = len(ctl._state._layouts)
    return {
        "params": _flat_params(model),
        "losses": losses,
        "stats": ctl.stats(),
        "plan": ctl.plan,
        "buckets": buckets,
    }


def _every_compressor(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    # Biases and norms stay uncompressed (as a real plan would); everything else uses the spec.
    return {
        spec: _train(rank, [("*.bias", "none"), ("norm.*", "none"), ("*", spec)])
        for spec in ALL_SPECS
    }


def _assert_identical_and_learning(results: list[dict[str, Any]], label: str) -> None:
    reference = results[0]
    for rank, result in enumerate(results[1:], start=1):
        assert torch.equal(reference["params"], result["params"]), (
            f"{label}: rank {rank} parameters differ from rank 0"
        )
        assert reference["plan"] == result["plan"]
    losses = reference["losses"]
    start, end = sum(losses[:3]) / 3, sum(losses[-5:]) / 5
    assert end < 0.9 * start, f"{label}: loss did not fall ({start:.3f} -> {end:.3f})"
    assert reference["buckets"] >= 3, f"{label}: model used only {reference['buckets']} buckets"


def test_every_compressor_keeps_ranks_identical(tmp_path: Path) -> None:
    """Each compressor alone on 2 ranks. Four ranks (more than two payloads to decode and
    sum) are covered by the mixed model below, which holds every compressor at once; running
    each alone on 4 ranks as well cost ~20 s of the suite and checked nothing
    the two do not."""
    world_size = 2
    results = run_ranks(_every_compressor, world_size, tmp_path, timeout=540)
    for spec in ALL_SPECS:
        per_rank = [r[spec] for r in results]
        _assert_identical_and_learning(per_rank, f"{spec} x{world_size}")
        stats = per_rank[0]["stats"]
        if spec != "none":
            assert stats["compression_ratio"] > 1.5, (spec, stats["compression_ratio"])


def _mixed(rank: int, world_size: int) -> dict[str, Any]:
    return _train(rank, EVERY_COMPRESSOR_PLAN, steps=40)


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_compressors_mixed_in_one_model(world_size: int, tmp_path: Path) -> None:
    results = run_ranks(_mixed, world_size, tmp_path)
    _assert_identical_and_learning(results, f"mixed x{world_size}")
    layers = results[0]["stats"]["layers"]
    assert {v["compressor"].split(":")[0] for v in layers.values()} == {
        s.split(":")[0] for s in ALL_SPECS
    }


def _bucket_views(rank: int, world_size: int) -> dict[str, Any]:
    return {
        view: _train(rank, EVERY_COMPRESSOR_PLAN, steps=12, bucket_view=view)["params"]
        for view in (False, True)
    }


def test_gradients_as_bucket_views_train_alike(tmp_path: Path) -> None:
    """``DDP(gradient_as_bucket_view=True)`` makes each ``.grad`` a view of its bucket, so the
    hook's in-place scaling and write-back land in the gradients directly: every compressor
    (PowerSGD's two rounds across buckets included) must give the bits it gives on copies."""
    results = run_ranks(_bucket_views, 2, tmp_path)
    for result in results:
        assert torch.equal(result[True], result[False])
    assert torch.equal(results[0][True], results[1][True])


def _train_bucketed(
    rank: int, bucket_cap_mb: float, plan: dict[str, str], steps: int
) -> dict[str, Any]:
    """Train MultiBucketNet(width=128) under ``plan``; final parameters and bucket count."""
    torch.manual_seed(0)
    model = MultiBucketNet(width=128)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    ctl = autocomp.wrap(ddp, plan=plan)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(steps):
        x, y = classification_batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return {"params": _flat_params(model), "buckets": len(ctl._state._layouts)}


def _powersgd_everywhere(rank: int, world_size: int) -> dict[str, Any]:
    # A tiny bucket cap gives one bucket per large layer: many buckets, each with PowerSGD,
    # which is where a second, callback-launched all-reduce would reorder across ranks.
    return _train_bucketed(rank, 0.005, {"*": "powersgd:rank=2"}, steps=25)


def test_powersgd_on_many_buckets_keeps_collective_order(tmp_path: Path) -> None:
    results = run_ranks(_powersgd_everywhere, 4, tmp_path)
    assert results[0]["buckets"] >= 4
    for result in results[1:]:
        assert torch.equal(results[0]["params"], result["params"])


def _bucketed(rank: int, world_size: int, bucket_cap_mb: float) -> dict[str, Any]:
    plan = {
        "fc1.weight": "powersgd:rank=2",
        "fc2.weight": "powersgd:rank=3",
        "fc3.weight": "fp16",
        "head.weight": "powersgd:rank=1",
        "norm.*": "bf16",
        "*": "none",
    }
    return _train_bucketed(rank, bucket_cap_mb, plan, steps=12)


def test_bucketing_does_not_change_the_result(tmp_path: Path) -> None:
    """Each layer's compression is its own, whatever bucket it lands in: with one bucket per
    layer (PowerSGD rounds carried from bucket to bucket, joined with the next bucket's first
    round and small plain parts, payloads of three dtypes) the parameters after 12 steps are
    bit-identical to one bucket's (2 ranks: a sum of two is the same in any grouping)."""
    many = run_ranks(_bucketed, 2, tmp_path / "many", 0.005)
    one = run_ranks(_bucketed, 2, tmp_path / "one", 10_000.0)
    assert many[0]["buckets"] >= 4 and one[0]["buckets"] == 1
    assert torch.equal(many[0]["params"], many[1]["params"])
    assert torch.equal(many[0]["params"], one[0]["params"])


def _plain_against_ddp(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in ("ddp", "autocomp"):
        torch.manual_seed(0)
        model = MultiBucketNet()
        ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
        ctl = autocomp.wrap(ddp, plan={"*": "none"}) if label == "autocomp" else None
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        for step in range(6):
            x, y = classification_batch(rank, step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        out[label] = _flat_params(model)
        if ctl is not None:
            ctl.close()
    return out


def test_uncompressed_layers_get_plain_ddps_bits(tmp_path: Path) -> None:
    """At 3 ranks, where dividing by 3 and multiplying by 1/3 differ in the last place: a plan
    of ``none`` trains to the same bits as DDP without a hook, which scales each gradient by
    ``1 / world`` as it copies it into the bucket. The hook scales the same way."""
    results = run_ranks(_plain_against_ddp, 3, tmp_path)
    for result in results:
        assert torch.equal(result["autocomp"], result["ddp"])
    assert torch.equal(results[0]["autocomp"], results[2]["autocomp"])


def _wire_bytes_probe(
    rank: int, world_size: int, plan: dict[str, str] | None = None
) -> dict[str, Any]:
    """Record every collective the hook issues and compare with the compressors' reports."""
    handed: list[tuple[str, int]] = []
    real_all_reduce = dist.all_reduce
    real_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        handed.append(("all_reduce", tensor.numel() * tensor.element_size()))
        return real_all_reduce(tensor, *args, **kwargs)

    def all_gather(output: torch.Tensor, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        handed.append(("all_gather", tensor.numel() * tensor.element_size()))
        return real_gather(output, tensor, *args, **kwargs)

    torch.manual_seed(0)
    model = MultiBucketNet()
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    plan = plan or {
        "fc1.weight": "powersgd:rank=3",
        "fc2.weight": "topk:ratio=0.02",
        "fc3.weight": "qsgd:levels=4",
        "conv.weight": "int8",
        "head.weight": "fp16",
        "*": "none",
    }
    ctl = autocomp.wrap(ddp, plan=plan)
    import autocomp.hook as hook_module

    per_step = []
    hook_module.dist.all_reduce = all_reduce  # type: ignore[assignment]
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    setattr(hook_module.dist, name, all_gather)
    try:
        for step in range(4):
            expected = sum(s.wire_bytes() for s in ctl._state.slots.values())
            handed.clear()
            x, y = classification_batch(rank, step)
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            per_step.append((expected, sum(size for _, size in handed), list(handed)))
    finally:
        hook_module.dist.all_reduce = real_all_reduce  # type: ignore[assignment]
        setattr(hook_module.dist, name, real_gather)
    return {
        "per_step": per_step,
        "stats": ctl.stats(),
        "plan": ctl.plan,
        "grads": [p.grad.clone() for p in model.parameters()],
        "residuals": {n: s.residual is not None for n, s in ctl._state.slots.items()},
    }


def test_bytes_handed_to_collectives_equal_reported_wire_bytes(tmp_path: Path) -> None:
    results = run_ranks(_wire_bytes_probe, 2, tmp_path)
    for expected, handed, calls in results[0]["per_step"]:
        assert handed == expected, calls
        kinds = [kind for kind, _ in calls]
        # Per bucket: all-reduces first (one per dtype), then at most one all-gather.
        assert "all_gather" in kinds and "all_reduce" in kinds
    # Every step sends the same bytes, and both ranks issue the same collectives in order.
    sizes = [handed for _, handed, _ in results[0]["per_step"]]
    assert len(set(sizes)) == 1
    assert [c for _, _, c in results[0]["per_step"]] == [c for _, _, c in results[1]["per_step"]]
    # PowerSGD's rounds for fc1.weight (96 x 64 at rank 3): P (96 x 3) in one all-reduce with
    # its bucket's small plain parts (fc1.bias and the LayerNorm, 3 x 96 floats, no more than
    # P), then later Q (64 x 3) in one with the next bucket's first all-reduce (conv.bias).
    calls = results[0]["per_step"][1][2]
    p_round = calls.index(("all_reduce", (96 * 3 + 3 * 96) * 4))
    assert ("all_reduce", (64 * 3 + 4) * 4) in calls[p_round + 1 :], calls


def test_tensors_powersgd_cannot_compress_ride_in_the_plain_all_reduce(tmp_path: Path) -> None:
    """``{"*": "powersgd:rank=2"}`` sends the biases and the LayerNorm (1-D) as 'none': the
    same collectives, bytes and gradients as the plan that says so, no residual kept for
    them, and the plan reports 'none' (PowerSGD's float32 copy path costs 20-40 us per 1-D
    tensor, and the engine priced a 12-layer GPT's 98 of them at 22 ms a step)."""
    everywhere = run_ranks(_wire_bytes_probe, 2, tmp_path / "glob", {"*": "powersgd:rank=2"})
    spelled = {"*bias": "none", "norm.*": "none", "*": "powersgd:rank=2"}
    explicit = run_ranks(_wire_bytes_probe, 2, tmp_path / "explicit", spelled)
    one_d = [
        "conv.bias",
        "fc1.bias",
        "norm.weight",
        "norm.bias",
        "fc2.bias",
        "fc3.bias",
        "head.bias",
    ]
    for result in everywhere:
        assert {n: result["plan"][n] for n in one_d} == dict.fromkeys(one_d, "none")
        assert result["plan"]["fc1.weight"] == "powersgd:rank=2,ef=true"
        assert not any(result["residuals"][n] for n in one_d)
        assert result["residuals"]["fc1.weight"]
        for expected, handed, _ in result["per_step"]:
            assert handed == expected
    for ours, theirs in zip(everywhere, explicit, strict=True):
        assert ours["plan"] == theirs["plan"]
        assert [c for *_, c in ours["per_step"]] == [c for *_, c in theirs["per_step"]]
        for a, b in zip(ours["grads"], theirs["grads"], strict=True):
            assert torch.equal(a, b)


def _close_then_train(rank: int, world_size: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = MultiBucketNet()
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    ctl = autocomp.wrap(ddp, plan={"*.weight": "topk:ratio=0.05"})
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(10):
        if step == 5:
            ctl.close()
            ctl.close()  # idempotent
        x, y = classification_batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    stats = ctl.stats()
    return {"params": _flat_params(model), "stats": stats, "closed": ctl.closed}


def test_close_falls_back_to_plain_all_reduce(tmp_path: Path) -> None:
    results = run_ranks(_close_then_train, 2, tmp_path)
    assert torch.equal(results[0]["params"], results[1]["params"])
    assert results[0]["closed"]
    layer = results[0]["stats"]["layers"]["fc2.weight"]
    # 5 steps compressed + 5 steps at full size: sent is between the two extremes.
    assert layer["bytes_uncompressed"] / 2 < layer["bytes_sent"] < layer["bytes_uncompressed"]


def _one_part_buckets_under_the_profiler(rank: int, world_size: int, spec: str) -> dict[str, Any]:
    """Adaptive (so the profiler runs) with every layer pinned to ``spec``: ``none`` makes
    every bucket plain, ``fp16:ef=false`` one cast span. Counts the callbacks registered on
    unsampled steps after the opening and DDP's bucket rebuild."""
    from autocomp import callbacks

    torch.manual_seed(0)
    model = MultiBucketNet()
    ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    ctl = autocomp.wrap(ddp, target_overlap=0.9, plan={"*": spec}, window=4, warmup_steps=0)
    registered = {"then": 0, "add_done_callback": 0}
    counts = dict(registered)

    def counting(name: str, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return function(*args, **kwargs)

        return call

    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    profiler = ctl._state.profiler
    assert profiler is not None
    steps, counted = 14, 0
    for step in range(steps):
        if step == 2:  # past the opening and DDP's bucket rebuild
            callbacks.then = counting("then", callbacks.then)
            callbacks.add_done_callback = counting("add_done_callback", callbacks.add_done_callback)
        counts.update({name: 0 for name in counts})
        x, y = classification_batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if step >= 2 and not profiler.sample_this_step:
            counted += 1
            for name, count in counts.items():
                registered[name] += count
    finished = [step for step, _ in profiler._finished]
    records = [r for step in finished for r in step.collectives]
    timed = {name for name, _, _ in profiler._layer_costs}
    return {
        "registered": registered,
        "buckets": len(ctl._state._layouts),
        "counted_steps": counted,
        "records": len(records),
        "stamped": all(r.done is not None and r.done >= r.launched for r in records),
        "finishes": sum(len(step.finishes) for step in finished),
        "every_layer_timed": timed == {n for n, _ in model.named_parameters()},
        "plan": set(ctl.plan.values()),
    }


@pytest.mark.parametrize("spec", ["none", "fp16:ef=false"])
def test_a_one_part_bucket_costs_one_callback_and_is_still_timed(tmp_path: Path, spec: str) -> None:
    """A plain bucket's all-reduce end is stamped in the callback DDP needs anyway (one
    Python callback per bucket, each a turn of the GIL for gloo's worker); so is a bucket
    that is one cast span, whose decode and layer costs are recorded there too."""
    for result in run_ranks(_one_part_buckets_under_the_profiler, 2, tmp_path, spec):
        assert result["plan"] == {spec}
        assert result["buckets"] >= 3
        assert result["counted_steps"] >= 3
        assert result["registered"] == {
            "then": result["buckets"] * result["counted_steps"],
            "add_done_callback": 0,
        }
        assert result["records"] > 0 and result["stamped"]
        if spec != "none":
            assert result["finishes"] > 0 and result["every_layer_timed"]


def _gather_after_first_round(rank: int, world_size: int) -> dict[str, Any]:
    """One bucket (so the last) holding a PowerSGD layer and an int8 layer: record, at each
    all-gather's launch, whether the all-reduces launched before it on this step are done
    (their futures: gloo marks a work's future done before the work itself)."""
    import time

    import autocomp.hook as hook_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    ddp = DDP(model, bucket_cap_mb=None)  # one 1 MB first bucket holds the whole model
    plan = {"0.weight": "powersgd:rank=2", "2.weight": "int8", "*": "none"}
    ctl = autocomp.wrap(ddp, plan=plan)
    real_all_reduce = dist.all_reduce
    name = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    real_gather = getattr(dist, name)
    reduces: list[Any] = []
    at_gather: list[bool] = []

    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        work = real_all_reduce(tensor, *args, **kwargs)
        reduces.append(work.get_future())
        return work

    def all_gather(output: torch.Tensor, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        at_gather.append(bool(reduces) and all(fut.done() for fut in reduces))
        return real_gather(output, tensor, *args, **kwargs)

    hook_module.dist.all_reduce = all_reduce  # type: ignore[assignment]
    setattr(hook_module.dist, name, all_gather)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    try:
        for _ in range(4):
            reduces.clear()
            x, y = torch.randn(16, 32), torch.randint(0, 5, (16,))
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            if rank == 1:
                # The other rank reaches its bucket late, so its first round cannot be done
                # yet when this rank's hook returns from launching it.
                time.sleep(0.2)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        hook_module.dist.all_reduce = real_all_reduce  # type: ignore[assignment]
        setattr(hook_module.dist, name, real_gather)
    return {
        "at_gather": at_gather,
        "buckets": len(ctl._state._layouts),
        "params": _flat_params(model),
    }


def test_the_last_buckets_gather_waits_for_its_first_round(tmp_path: Path) -> None:
    """gloo runs a group's collectives concurrently: an all-gather launched beside the last
    bucket's first round would take link time from the round its final round waits for."""
    results = run_ranks(_gather_after_first_round, 2, tmp_path)
    assert torch.equal(results[0]["params"], results[1]["params"])
    for result in results:
        assert result["buckets"] == 1
        assert result["at_gather"] == [True] * 4, [r["at_gather"] for r in results]


def _cast_spans_either_way(rank: int, world_size: int) -> dict[str, Any]:
    """Train on 16-bit casts with cast spans on and then off, under two plans: ``split``, two
    spans per bucket where ``fc2``'s ``none`` splits them, and ``whole``, where every bucket
    is one span (:func:`autocomp.hook_cast_span.exchange_cast_bucket`). Rank 0 feeds
    ``fc3.weight`` an Inf at step 6, and a step with any non-finite gradient is skipped, as a
    GradScaler would."""
    from autocomp import hook, hook_cast_span

    spanned = []
    whole = []
    find = hook.find_cast_spans
    exchange = hook.exchange_cast_bucket

    def counted(*args: Any) -> Any:
        found = find(*args)
        spanned.append(sum(len(span.slots) for span in found.values()))
        return found

    def exchanged(*args: Any) -> Any:
        whole.append(args[0].step)
        return exchange(*args)

    inside = []  # spans sent as parts of a bucket's general exchange
    encode_part = hook._encode_span

    def part(*args: Any) -> Any:
        inside.append(len(args[1].slots))
        return encode_part(*args)

    hook.find_cast_spans = counted  # type: ignore[assignment]
    hook.exchange_cast_bucket = exchanged  # type: ignore[assignment]
    hook._encode_span = part  # type: ignore[assignment]
    out: dict[str, Any] = {}
    plans = {
        "split": [("fc2.*", "none"), ("norm.*", "bf16:ef=false"), ("*", "fp16:ef=false")],
        "whole": [("*", "fp16:ef=false")],
    }
    try:
        for label, plan in plans.items():
            for spans in (True, False):
                hook_cast_span.CAST_SPANS = spans
                spanned.clear()
                whole.clear()
                inside.clear()
                torch.manual_seed(0)
                model = MultiBucketNet()
                ddp = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
                ctl = autocomp.wrap(ddp, plan=plan)
                step_now = [0]

                def poison(grad: torch.Tensor, step_now: list[int] = step_now) -> torch.Tensor:
                    if rank == 0 and step_now[0] == 6:
                        grad = grad.clone()
                        grad[1, 2] = float("inf")
                    return grad

                model.fc3.weight.register_hook(poison)
                opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
                bad_steps: list[list[str]] = []
                for step in range(12):
                    step_now[0] = step
                    x, y = classification_batch(rank, step)
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(ddp(x), y).backward()
                    bad = [n for n, p in model.named_parameters() if not p.grad.isfinite().all()]
                    bad_steps.append(bad)
                    if not bad:
                        opt.step()
                out[f"{label} {spans}"] = {
                    "params": _flat_params(model),
                    "bad": bad_steps,
                    "events": list(ctl._state.nonfinite_events),
                    "spanned": sum(spanned),
                    "whole": [whole.count(step) for step in range(12)],
                    "inside": len(inside),
                    "buckets": len(ctl._state._layouts),
                }
                ctl.close()
    finally:
        hook.find_cast_spans = find  # type: ignore[assignment]
        hook.exchange_cast_bucket = exchange  # type: ignore[assignment]
        hook._encode_span = encode_part  # type: ignore[assignment]
        hook_cast_span.CAST_SPANS = True
    return out


def test_cast_spans_train_bit_identically_to_the_per_layer_path(tmp_path: Path) -> None:
    """Cast spans (``autocomp.hook_cast_span``) change only how the hook's CPU work is batched:
    on 2 ranks, over several buckets and two cast dtypes, the parameters are bit-identical to
    the per-layer path's, and an Inf in one layer's gradient marks that layer alone: its
    average is non-finite at step 6, every other layer's is finite, and the hook resets that
    layer (sends it plain the step after, which splits its span there). The same holds when
    every bucket is one span and skips the hook's general machinery: all of them are sent
    that way but the reset layer's bucket at step 7."""
    results = run_ranks(_cast_spans_either_way, 2, tmp_path)
    for result in results:
        for label in ("split", "whole"):
            spans, per_layer = result[f"{label} True"], result[f"{label} False"]
            assert spans["spanned"] > 0 and per_layer["spanned"] == 0
            assert torch.equal(spans["params"], per_layer["params"])
            assert spans["bad"] == per_layer["bad"]
            assert spans["bad"][6] == ["fc3.weight"] and not any(spans["bad"][7:])
            assert spans["events"] == per_layer["events"] == [(6, "fc3.weight")]
            assert not any(per_layer["whole"])
        split, whole = result["split True"], result["whole True"]
        assert split["inside"] > 0  # spans beside other parts: the general path
        # Every bucket after DDP's rebuild at step 1, but fc3.weight's at step 7.
        buckets = whole["buckets"]
        assert buckets > 1
        assert whole["whole"][1:] == [buckets] * 6 + [buckets - 1] + [buckets] * 4
    for key in ("split True", "whole True"):
        assert torch.equal(results[0][key]["params"], results[1][key]["params"])
