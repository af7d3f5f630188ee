"""Tier 1 and 2: float64 and complex parameters through the comm hook, on 2 gloo ranks.

Scientific models keep some layers (or all) in double precision, and spectral ones (Fourier
neural operators) hold complex weights. DDP buckets float64 apart from float32, and a complex
gradient as its real view (twice the elements). The hook must send both as it sends any
gradient.

float64: the first adaptive run on such a model raised in the backward's first bucket: the
sampled gradient norm asked ``vector_norm`` for a float32 result, which it refuses for a
float64 input (a narrowing). Checks:

- adaptive mode on a model with one float64 layer, with a slow link so that the policy
  compresses: the ranks stay bit-identical, the float64 layer is compressed at some step,
  and the loss falls;
- a whole float64 model with every compressor family: a ``none`` plan gives plain DDP's
  bits, and the compressed plan keeps the ranks identical and learns as the uncompressed
  run does.

complex: every use failed at the first backward ("bucket holds 8192 elements but its
parameters add up to 4096"), since the hook sized each parameter's slice by its complex
element count. Checks: a ``none`` plan gives DDP's bits, and compressors (which see the real
view, real and imaginary parts side by side) keep the ranks identical and learn as the
uncompressed run does; adaptive mode under a slow link compresses the complex layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from autocomp.hook_layer import bucket_shape, float32_norm
from autocomp.link_model import LinkEstimate
from tests.models import EVERY_COMPRESSOR_PLAN, MultiBucketNet, classification_batch
from tests.multirank import run_ranks

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

STEPS = 40
WINDOW = 5
POLICY = f"""
version = 1
[policy]
description = "float64 test: small tensors allowed"
warmup_steps = {WINDOW}
min_numel = 64
compress_1d = false
fast_link_gbit = 25.0
candidates = ["none", "fp16", "int8", "topk:ratio=0.1", "powersgd:rank=2"]
"""
SLOW_LINK = LinkEstimate(
    latency_s=1e-3, bandwidth_bytes_per_s=10e6 / 8, samples=16, rel_residual=0.0
)


def test_float32_norm_of_every_dtype() -> None:
    """Tier 1: the sampled norm is float32 whatever the gradient's dtype, and exact to
    float32 rounding (float64 is reduced in double, then narrowed)."""
    values = torch.arange(1, 101, dtype=torch.float64) / 7
    expected = float(torch.linalg.vector_norm(values))
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        norm = float32_norm(values.to(dtype))
        assert norm.dtype == torch.float32 and norm.dim() == 0
        tolerance = 1e-6 if dtype in (torch.float64, torch.float32) else 1e-2
        assert abs(float(norm) - expected) <= tolerance * expected, dtype


class _DoubleMiddleNet(nn.Module):
    """float32 layers around a float64 one (its activations cast in and out)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 64).double()
        self.head = nn.Linear(64, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.fc2(h.double())).float()
        return self.head(h)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def _wrap_on_a_slow_link(ddp: DDP, rank: int, policy: str) -> autocomp.Controller:
    """Adaptive mode with rank 0's link fit pinned to a slow link, so that the policy
    compresses (as in ``tests/test_amp.py``)."""
    ctl = autocomp.wrap(ddp, target_overlap=0.9, policy=policy, window=WINDOW)
    assert ctl.adaptive is not None
    if rank == 0:
        ctl.adaptive.meter.end_window = lambda **_: SLOW_LINK  # type: ignore[method-assign]
        ctl.adaptive.payoff.hold_reason = lambda *_: None  # type: ignore[method-assign]
    return ctl


def _train(
    ddp: DDP, rank: int, ctl: autocomp.Controller | None, layer: str
) -> tuple[list[float], list[str]]:
    """``STEPS`` SGD steps on the shared classification batches: the losses, and ``layer``'s
    compressor at each step (none without a controller)."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses, specs = [], []
    for step in range(STEPS):
        x, y = classification_batch(rank, step)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if ctl is not None:
            ctl.observe_loss(loss.detach())
            specs.append(ctl.plan[layer])
    if ctl is not None:
        ctl.close()
    return losses, specs


def _adaptive(rank: int, world_size: int, policy: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _DoubleMiddleNet()
    ddp = DDP(model, bucket_cap_mb=0.01)
    ctl = _wrap_on_a_slow_link(ddp, rank, policy)
    losses, plans = _train(ddp, rank, ctl, "fc2.weight")
    return {"params": _flat(model), "losses": losses, "plans": plans}


def test_adaptive_mode_compresses_a_float64_layer(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(_adaptive, 2, tmp_path / "ranks", str(policy))
    assert torch.equal(results[0]["params"], results[1]["params"]), "ranks differ"
    assert results[0]["plans"] == results[1]["plans"]
    assert any(spec != "none" for spec in results[0]["plans"]), results[0]["plans"]
    losses = results[0]["losses"]
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5, losses


def _every_compressor(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for plan in ("ddp", "none", "every"):
        torch.manual_seed(0)
        model = MultiBucketNet().double()
        ddp = DDP(model, bucket_cap_mb=0.02)
        ctl = None
        if plan != "ddp":
            rules = EVERY_COMPRESSOR_PLAN if plan == "every" else {"*": "none"}
            ctl = autocomp.wrap(ddp, plan=rules)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        losses = []
        for step in range(STEPS):
            x, y = classification_batch(rank, step)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x.double()), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if ctl is not None:
            ctl.close()
        out[plan] = {"params": _flat(model), "losses": losses}
    return out


def test_every_compressor_on_a_float64_model(tmp_path: Path) -> None:
    results = run_ranks(_every_compressor, 2, tmp_path)
    for result in results:
        assert torch.equal(result["none"]["params"], result["ddp"]["params"])
    compressed = [r["every"] for r in results]
    assert torch.equal(compressed[0]["params"], compressed[1]["params"])
    losses, reference = compressed[0]["losses"], results[0]["none"]["losses"]
    start, end = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert end < 0.95 * start, f"loss did not fall: {start:.3f} -> {end:.3f}"
    assert abs(end - sum(reference[-3:]) / 3) < 0.1, (end, reference[-3:])


def test_bucket_shape_of_a_complex_parameter() -> None:
    """Tier 1: a complex parameter is bucketed as its real view."""
    param = torch.zeros(3, 4, dtype=torch.complex64)
    assert bucket_shape(param) == (torch.Size((3, 4, 2)), torch.float32)
    assert bucket_shape(torch.zeros(3, 4, dtype=torch.float64)) == ((3, 4), torch.float64)


class _SpectralNet(nn.Module):
    """A complex mixing matrix between real layers (as in a Fourier layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.mix = nn.Parameter(torch.randn(64, 64, dtype=torch.complex64) / 8)
        self.head = nn.Linear(64, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        return self.head((h.to(torch.complex64) @ self.mix).real)


def _complex_flat(model: nn.Module) -> torch.Tensor:
    return torch.cat(
        [
            torch.view_as_real(p.detach()).reshape(-1) if p.is_complex() else p.detach().reshape(-1)
            for p in model.parameters()
        ]
    )


def _complex(rank: int, world_size: int, policy: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for plan in ("ddp", "none", "powersgd:rank=2", "int8", "topk:ratio=0.1", "adaptive"):
        torch.manual_seed(0)
        model = _SpectralNet()
        ddp = DDP(model, bucket_cap_mb=0.01)
        ctl = None
        if plan == "adaptive":
            ctl = _wrap_on_a_slow_link(ddp, rank, policy)
        elif plan != "ddp":
            ctl = autocomp.wrap(ddp, plan={"mix": plan, "*": "none"})
        losses, specs = _train(ddp, rank, ctl, "mix")
        out[plan] = {"params": _complex_flat(model), "losses": losses, "specs": specs}
    return out


def test_complex_parameters(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    results = run_ranks(_complex, 2, tmp_path / "ranks", str(policy))
    for result in results:
        assert torch.equal(result["none"]["params"], result["ddp"]["params"])
    reference = results[0]["none"]["losses"]
    for plan in ("powersgd:rank=2", "int8", "topk:ratio=0.1", "adaptive"):
        runs = [r[plan] for r in results]
        assert torch.equal(runs[0]["params"], runs[1]["params"]), plan
        losses = runs[0]["losses"]
        start, end = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
        assert end < 0.95 * start, (plan, start, end)
        assert abs(end - sum(reference[-3:]) / 3) < 0.1, (plan, end, reference[-3:])
    assert any(spec != "none" for spec in results[0]["adaptive"]["specs"])
