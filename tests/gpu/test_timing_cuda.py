"""Tier 4 (GPU): CUDA-event timing (``autocomp.timing.CudaClock``) and NCCL completion order.

On a GPU the profiler cannot use host time: kernels run long after the Python that launched
them returned, and NCCL hands back a future when a collective is enqueued. These tests check
the clock's contract there:

- stamps measure device work, not host time: a large matmul between two stamps measures more
  than an empty interval, and a spinning kernel that took the host microseconds to launch
  measures its device length;
- ``ready`` never blocks: a stamp behind unfinished work is not ready until the device
  reaches it;
- under NCCL (one process, world size 1), the profiler's completion stamp of a collective
  completes after the device work queued before the collective (not at its enqueue);
- the comm hook's futures complete after the decode: with the decode slowed down on the
  device, what DDP copies into ``.grad`` is still the decoded gradient (top-k of the raw
  gradient), and a stamp taken in the future's callback comes after the slow decode.

Skipped without CUDA, and the NCCL ones without an NCCL build (see ``tests/gpu/cuda.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import autocomp
from autocomp.compressors import Collective, TopK, build_compressor, run_rounds_locally
from autocomp.profiler import StepProfiler
from autocomp.timing import CudaClock, elapsed
from tests.gpu.cuda import GPU_MARKS, requires_nccl, spin_cycles

pytestmark = [*GPU_MARKS, pytest.mark.timeout(300)]

SPIN_S = 0.1
"""Length of the device work the tests queue (long next to any host-side launch)."""


@pytest.fixture
def device() -> torch.device:
    torch.cuda.set_device(0)
    return torch.device("cuda", 0)


def test_stamps_measure_device_work(device: torch.device) -> None:
    clock = CudaClock(device)
    x = torch.randn(4096, 4096, device=device)
    torch.cuda.synchronize(device)
    empty_start = clock.stamp()
    empty_end = clock.stamp()
    work_start = clock.stamp()
    for _ in range(4):
        x = (x @ x).div_(4096**0.5)  # scaled so it stays finite
    work_end = clock.stamp()
    empty = elapsed(clock, empty_start, empty_end)
    work = elapsed(clock, work_start, work_end)
    assert 0.0 <= empty < 1e-3, empty
    assert work > 0.0
    assert work > 10 * max(empty, 1e-6), (empty, work)


def test_stamps_read_device_time_not_host_time(device: torch.device) -> None:
    clock = CudaClock(device)
    cycles = spin_cycles(device, SPIN_S)
    torch.cuda.synchronize(device)
    start = clock.stamp()
    launched = time.perf_counter()
    torch.cuda._sleep(cycles)
    end = clock.stamp()
    host = time.perf_counter() - launched
    # The host is already past the spin; the device is not: ready() says so without waiting.
    assert not clock.ready([end]), "the stamp after a 0.1 s spin cannot be complete yet"
    device_seconds = elapsed(clock, start, end)  # waits for ``end``
    assert clock.ready([start, end])
    assert device_seconds > 0.5 * SPIN_S, device_seconds
    assert host < 0.5 * device_seconds, (host, device_seconds)
    reader = clock.reader(start)
    assert reader(start) == pytest.approx(0.0, abs=1e-6)
    assert reader(end) == pytest.approx(device_seconds)
    with pytest.raises(TypeError):
        clock.reader(1.0)


@pytest.fixture
def nccl_world_of_one(device: torch.device, tmp_path: Path) -> Iterator[torch.device]:
    """This process as the only rank of an NCCL process group (FileStore rendezvous)."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    try:
        yield device
    finally:
        dist.destroy_process_group()


@requires_nccl
def test_collective_completion_stamp_follows_the_device(nccl_world_of_one: torch.device) -> None:
    device = nccl_world_of_one
    clock = CudaClock(device)
    profiler = StepProfiler(clock)
    cycles = spin_cycles(device, SPIN_S)
    tensor = torch.ones(1 << 20, device=device)
    torch.cuda.synchronize(device)
    profiler.begin_step()
    start = clock.stamp()
    torch.cuda._sleep(cycles)  # the collective is queued behind this
    future = dist.all_reduce(tensor, async_op=True).get_future()
    profiler.collective(Collective.ALL_REDUCE, tensor.numel() * 4, future)
    future.wait()
    torch.cuda.synchronize(device)
    step = profiler.current_step
    assert step is not None and len(step.collectives) == 1
    record = step.collectives[0]
    assert record.done is not None, "the completion callback never stamped"
    assert elapsed(clock, start, record.done) > 0.5 * SPIN_S
    assert elapsed(clock, record.launched, record.done) >= 0.0
    assert torch.equal(tensor, torch.ones_like(tensor))  # world size 1: the sum is itself


PLAN = {"*.bias": "none", "*": "topk:ratio=0.05,ef=false"}


@requires_nccl
def test_hook_future_completes_after_the_decode(
    nccl_world_of_one: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = nccl_world_of_one
    clock = CudaClock(device)
    cycles = spin_cycles(device, SPIN_S)
    original = TopK.decompress_into

    def slow_decode(self: TopK, *args: Any, **kwargs: Any) -> None:
        torch.cuda._sleep(cycles)  # on the stream the decode runs on, before it
        original(self, *args, **kwargs)

    monkeypatch.setattr(TopK, "decompress_into", slow_decode)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64)
    ).to(device)
    ddp = DDP(model, device_ids=[device.index])
    state, hook = autocomp.make_hook(autocomp.AutocompConfig(plan=PLAN))
    state.bind(ddp)
    raw: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    futures: list[torch.futures.Future] = []
    done_stamps: list[Any] = []

    # Unannotated: DDP rejects a hook whose annotations are strings (this module's
    # ``from __future__ import annotations``); the parameter must be named ``bucket``.
    def spy(hook_state, bucket):  # type: ignore[no-untyped-def]
        raw.extend(
            (param, grad.detach().clone())
            for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True)
        )
        future = hook(hook_state, bucket)
        future.add_done_callback(lambda _: done_stamps.append(clock.stamp()))
        futures.append(future)
        return future

    ddp.register_comm_hook(state, spy)
    x = torch.randn(128, 256, device=device)
    torch.cuda.synchronize(device)
    begin = clock.stamp()
    ddp(x).square().mean().backward()
    grads = {id(p): p.grad.detach().cpu() for p in model.parameters() if p.grad is not None}
    torch.cuda.synchronize(device)
    # A future wakes its waiters before it runs its callbacks: give them a moment.
    deadline = time.monotonic() + 10.0
    while len(done_stamps) < len(futures) and time.monotonic() < deadline:
        time.sleep(0.01)

    assert futures, "DDP never called the comm hook"
    assert all(f.done() for f in futures) and len(done_stamps) == len(futures)
    assert len(raw) == len(list(model.parameters())) == len(grads)
    topk = build_compressor("topk:ratio=0.05,ef=false")
    for param, raw_grad in raw:
        got = grads[id(param)]
        if param.dim() == 1:  # biases: plain all-reduce of one rank
            assert torch.equal(got, raw_grad.cpu())
            continue
        cpu_grad = raw_grad.cpu()
        topk_state: dict[str, Any] = {}
        payload = run_rounds_locally(topk, cpu_grad, topk_state)
        expected = topk.decompress_sum([payload], cpu_grad.shape, topk_state)
        assert torch.equal(got, expected), "DDP copied the gradient before the decode ended"
        assert int(torch.count_nonzero(got)) <= round(0.05 * got.numel())
    # The callbacks' stamps follow the slowed decode on the device.
    assert done_stamps and max(elapsed(clock, begin, s) for s in done_stamps) > 0.5 * SPIN_S
