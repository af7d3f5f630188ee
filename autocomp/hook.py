"""The one DDP comm hook: per-layer compression inside each bucket.

DDP allows a single comm hook per model, so this hook dispatches every gradient of a bucket to
its own layer's compressor. Per bucket it issues at most one all-reduce per payload dtype
(in a fixed dtype order) followed by at most one all-gather of opaque bytes. Every collective
is launched synchronously from a hook call, never from a future callback, and DDP calls the
hook in bucket order on every rank; with identical plans (checked at ``wrap``), every rank
therefore issues the same collectives, with the same sizes, in the same order.

Two-round compressors (PowerSGD: P, then Q computed from the summed P) are pipelined across
buckets. Bucket b's hook call launches the first round of its two-round layers ahead of its
other collectives; bucket b+1's hook call waits for that round, computes and launches bucket
b's final round, then proceeds with its own; the last bucket runs its final round at once.
The order is again a pure function of the plan and the bucket order:

    P_0, rest_0 | Q_0, P_1, rest_1 | Q_1, P_2, rest_2 | ... | Q_{n-1}, P_n, rest_n, Q_n

so it holds on gloo and NCCL with any number of buckets (PyTorch's own hook launches Q from a
callback, which reorders across ranks when buckets complete in different orders). Bucket b's
future is completed by hand once its final round is decoded. The wait in bucket b+1's call
is short when the backward between the two buckets covers the small P all-reduce; on CUDA it
only orders the compute stream after the collective.

Gradients are divided by the world size before compression, so summing what all ranks sent
yields the average. Biased compressors keep an error-feedback residual per parameter, keyed
by parameter name so it survives DDP's bucket rebuild after the first iteration.

Non-finite gradients: after the collectives, each compressed layer's decoded average is checked
(identical on every rank, so every rank reacts identically). A layer whose average is NaN/Inf
gets its error feedback and compressor state reset, and is sent uncompressed on the next step;
the non-finite average itself reaches the optimizer exactly as plain DDP would deliver it, so
AMP's GradScaler still sees it and skips the step.

(No ``from __future__ import annotations`` here: DDP inspects the hook's annotations at
registration and rejects string annotations.)
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from autocomp.compressors import Collective, Compressor, NoCompression
from autocomp.profiler import StepProfiler
from autocomp.timing import clock_for

logger = logging.getLogger(__name__)


def _is_identity(compressor: Compressor) -> bool:
    return type(compressor) is NoCompression


@dataclass(slots=True)
class LayerSlot:
    """Everything the hook keeps for one parameter."""

    name: str
    """Qualified parameter name, the stable key across bucket rebuilds and checkpoints."""
    shape: torch.Size
    """Gradient shape."""
    dtype: torch.dtype
    """Gradient dtype as it sits in the bucket."""
    seed: int
    """Per-layer seed, identical on all ranks (shared random choices)."""
    compressor: Compressor = field(default_factory=NoCompression)
    """Current compressor."""
    state: dict[str, Any] = field(default_factory=dict)
    """Compressor state (warm-start factors, generators, counters)."""
    residual: torch.Tensor | None = None
    """Error-feedback memory (float32, gradient shape), or None."""
    bytes_sent: int = 0
    """Wire bytes this rank handed to collectives for this layer, all steps."""
    bytes_raw: int = 0
    """Bytes an uncompressed all-reduce would have sent, all steps."""
    uncompressed_until: int = 0
    """Send uncompressed while the hook's step is below this (after a non-finite average)."""

    @property
    def numel(self) -> int:
        return self.shape.numel()

    def wire_bytes(self) -> int:
        """Bytes the next step sends for this layer."""
        return self.compressor.wire_bytes(self.shape, self.dtype)


@dataclass(slots=True)
class _BucketLayout:
    key: tuple[int, ...]
    slots: list[LayerSlot]
    offsets: list[int]


class HookState:
    """State of the unified hook: per-parameter slots and cached bucket layouts."""

    def __init__(
        self,
        process_group: dist.ProcessGroup | None,
        slots: dict[str, LayerSlot],
        param_names: dict[int, str],
        *,
        rank: int,
        world_size: int,
        check_wire_bytes: bool = True,
    ) -> None:
        self.process_group = process_group
        self.slots = slots
        self.param_names = param_names
        self.rank = rank
        self.world_size = world_size
        self.check_wire_bytes = check_wire_bytes
        self.step = 0
        """Steps completed: incremented when the last bucket of a backward is launched."""
        self.enabled = True
        """False after ``close()``: the hook then does a plain averaging all-reduce."""
        self.profiler: StepProfiler | None = None
        """Set by the adaptive controller; None in static mode (no timing overhead)."""
        self.step_listener: Callable[[int], None] | None = None
        """Called at the first bucket of every step, before any of its collectives, with the
        step about to run: the adaptive loop's window boundaries happen there, inside the comm
        hook, where every rank is at the same point and compiled code cannot reorder them."""
        self._in_step = False
        self.nonfinite_events: list[tuple[int, str]] = []
        """(step, layer) of every non-finite average seen; drained by the controller."""
        self.pending_round: _BucketWork | None = None
        """A bucket whose final round the next bucket's hook call launches."""
        self._layouts: dict[int, _BucketLayout] = {}
        self._pending_checks: list[tuple[int, LayerSlot, torch.Tensor]] = []
        self._checked_step = 0

    def resolve_nonfinite(self) -> None:
        """React to last step's non-finite averages, identically on every rank.

        The flags are 0-d device tensors; they are stacked and read with one host sync per step
        (at the first bucket of the next step), rather than one per layer in the completion
        callbacks. Only when that one read finds a non-finite average are they read one by one.
        """
        if self._checked_step == self.step:
            return
        self._checked_step = self.step
        pending, self._pending_checks = self._pending_checks, []
        if not pending:
            return
        flags = torch.stack([finite.to(pending[0][2].device) for _, _, finite in pending])
        every = flags.all()
        if bool(every):
            return
        finite_flags = flags.tolist()
        for (step, slot, _), finite in zip(pending, finite_flags, strict=True):
            if finite:
                continue
            slot.residual = None
            slot.state = slot.compressor.init_state(slot.shape, slot.seed, self.rank)
            slot.uncompressed_until = self.step + 1
            self.nonfinite_events.append((step, slot.name))
            logger.warning(
                "autocomp: non-finite average gradient for %s at step %d: error feedback "
                "reset, sent uncompressed at step %d",
                slot.name,
                step,
                self.step,
            )

    def assign(self, assignment: dict[str, Compressor]) -> list[str]:
        """Switch layers to new compressors between steps; returns the names that changed.

        A layer whose compressor changes starts with fresh compressor state. Its residual is
        kept: an error-feedback compressor continues from it, and any other compressor adds it
        to the next gradient once, so no gradient mass is lost in the switch.
        """
        changed = []
        for name, compressor in assignment.items():
            slot = self.slots[name]
            if slot.compressor == compressor:
                continue
            slot.compressor = compressor
            slot.state = compressor.init_state(slot.shape, slot.seed, self.rank)
            changed.append(name)
        return changed

    def layout(self, bucket: dist.GradBucket) -> _BucketLayout:
        params = bucket.parameters()
        key = tuple(id(p) for p in params)
        cached = self._layouts.get(bucket.index())
        if cached is not None and cached.key == key:
            return cached
        slots, offsets, offset = [], [], 0
        for param in params:
            name = self.param_names.get(id(param))
            if name is None:
                raise RuntimeError(
                    "autocomp: DDP handed the hook a parameter that was not in the model at "
                    "wrap() time; parameters must not be replaced after wrapping"
                )
            slots.append(self.slots[name])
            offsets.append(offset)
            offset += param.numel()
        if offset != bucket.buffer().numel():
            raise RuntimeError(
                f"autocomp: bucket {bucket.index()} holds {bucket.buffer().numel()} elements but "
                f"its parameters add up to {offset}; this DDP layout is not supported"
            )
        layout = _BucketLayout(key, slots, offsets)
        self._layouts[bucket.index()] = layout
        return layout

    def bucket_of(self) -> dict[str, int]:
        """DDP bucket index of every parameter seen so far (after the rebuild: the final one)."""
        return {
            slot.name: index for index, layout in self._layouts.items() for slot in layout.slots
        }

    def sends_plain(self, slot: LayerSlot) -> bool:
        """True when this layer goes into the bucket's all-reduce as it is this step."""
        return slot.residual is None and (
            _is_identity(slot.compressor) or self.step < slot.uncompressed_until
        )


def _all_gather(output: torch.Tensor, payload: torch.Tensor, group: Any) -> torch.futures.Future:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, payload, group=group, async_op=True).get_future()


@dataclass(slots=True)
class _Encoding:
    """One layer's payload for this step, possibly still between rounds."""

    slot: LayerSlot
    work: torch.Tensor
    """What is being compressed (gradient plus residual, float32); kept for later rounds."""
    payload: torch.Tensor
    """The current round's payload (the final one once ``settled``)."""
    plain: bool
    """Sent as the gradient itself (no decode, no compressor state to advance)."""
    rounds: int = 1
    round_index: int = 0
    grad_norm: torch.Tensor | float = 0.0
    """Norm of this step's gradient alone (sampled steps only; a 0-d tensor, read by the
    profiler once per window)."""

    @property
    def settled(self) -> bool:
        return self.round_index == self.rounds - 1


def _check_round_bytes(encoding: _Encoding) -> None:
    slot = encoding.slot
    expected = slot.compressor.round_wire_bytes(slot.shape, slot.dtype)[encoding.round_index]
    sent = encoding.payload.numel() * encoding.payload.element_size()
    if sent != expected:
        raise RuntimeError(
            f"compressor {slot.compressor.spec} produced {sent} bytes in round "
            f"{encoding.round_index} for {slot.name} {tuple(slot.shape)} but reports {expected}"
        )


def _begin(slot: LayerSlot, grad: torch.Tensor, state: Any) -> _Encoding:
    """First round of one layer's (already divided) gradient; settles single-round ones."""
    compressor = slot.compressor
    grad = grad.view(slot.shape)
    sampling = state.profiler is not None and state.profiler.sample_this_step
    grad_norm = torch.linalg.vector_norm(grad, dtype=torch.float32) if sampling else 0.0
    # With a residual, work in its own buffer: no allocation, one pass. Without one, only
    # error feedback needs a private float32 copy (it becomes the residual); every other
    # compressor reads the bucket slice itself (``compress`` must not modify its input).
    residual = slot.residual
    if residual is not None:
        x = residual.add_(grad)
    else:
        x = grad.to(torch.float32, copy=compressor.error_feedback)
    if _is_identity(compressor) or state.step < slot.uncompressed_until:
        # A pending residual is flushed into an uncompressed layer in its own dtype.
        slot.residual = None
        return _Encoding(slot, x, x.reshape(-1).to(slot.dtype), plain=True)
    rounds = compressor.rounds_for(slot.shape)
    if rounds > 2:
        raise NotImplementedError(
            f"compressor {compressor.spec} needs {rounds} collectives per step; the hook "
            "pipelines at most 2"
        )
    encoding = _Encoding(
        slot, x, compressor.compress(x, slot.state), False, rounds, grad_norm=grad_norm
    )
    if state.check_wire_bytes:
        _check_round_bytes(encoding)
    if encoding.settled:
        _settle(encoding, state)
    return encoding


def _advance(encoding: _Encoding, received: torch.Tensor, state: Any) -> None:
    """The next round's payload from the previous round's summed result."""
    slot = encoding.slot
    encoding.round_index += 1
    encoding.payload = slot.compressor.compress_round(
        encoding.work, encoding.round_index, received, slot.state
    )
    if state.check_wire_bytes:
        _check_round_bytes(encoding)
    if encoding.settled:
        _settle(encoding, state)


def _settle(encoding: _Encoding, state: Any) -> None:
    """Error feedback and the sampled error, once the final payload is known."""
    slot, x, payload = encoding.slot, encoding.work, encoding.payload
    compressor = slot.compressor
    sampling = state.profiler is not None and state.profiler.sample_this_step
    profiler = state.profiler if sampling else None
    # Norms stay on the device: the profiler reads a window's worth in one transfer.
    x_norm = torch.linalg.vector_norm(x) if profiler is not None else 0.0
    error: torch.Tensor | float = 0.0
    if compressor.error_feedback:
        slot.residual = compressor.subtract_estimate_(x, payload, slot.state)
        if profiler is not None:
            error = torch.linalg.vector_norm(slot.residual)
    else:
        slot.residual = None
        if profiler is not None:
            estimate = compressor.decompress(payload, slot.shape, slot.state)
            error = torch.linalg.vector_norm(x - estimate)
    if profiler is not None:
        profiler.layer_sample(
            slot.name,
            compressor.spec,
            grad_norm=encoding.grad_norm,
            residual_norm=error if slot.residual is not None else 0.0,
            error=error,
            x_norm=x_norm,
        )


def encode_locally(slot: LayerSlot, grad: torch.Tensor, state: Any) -> tuple[torch.Tensor, bool]:
    """Every round of one layer as a single rank would run them (its own payload is each
    round's sum); returns the final payload and whether it is the plain gradient.

    The hook's exact per-layer code path without collectives: for tests and replays.
    """
    encoding = _begin(slot, grad, state)
    while not encoding.settled:
        _advance(encoding, encoding.payload, state)
    return encoding.payload, encoding.plain


def _sample_plain(slot: LayerSlot, grad: torch.Tensor, profiler: StepProfiler) -> None:
    norm = torch.linalg.vector_norm(grad, dtype=torch.float32)
    profiler.layer_sample(slot.name, slot.compressor.spec, grad_norm=norm)


@dataclass(slots=True)
class _Part:
    encoding: _Encoding
    offset: int


@dataclass(slots=True)
class _BucketWork:
    """One bucket's collectives in flight, until its result is written back."""

    step: int
    buffer: torch.Tensor
    profiled_step: Any = None
    """The profiler's record of the step (decode may finish after the next step began)."""
    futures: list[torch.futures.Future] = field(default_factory=list)
    reduce_groups: list[tuple[torch.Tensor, list[_Part]]] = field(default_factory=list)
    gather_parts: list[_Part] = field(default_factory=list)
    gathered: torch.Tensor | None = None
    round_parts: list[_Part] = field(default_factory=list)
    """Two-round layers: round 0 in ``round_flat``, the final round later in ``final_flat``."""
    round_flat: torch.Tensor | None = None
    round_future: torch.futures.Future | None = None
    final_flat: torch.Tensor | None = None
    result: torch.futures.Future | None = None
    """Completed by hand once the final round is decoded (two-round buckets only)."""


def autocomp_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook applying each parameter's compressor; see the module docstring."""
    state.resolve_nonfinite()
    if not state._in_step:
        state._in_step = True
        if state.step_listener is not None:
            state.step_listener(state.step)
    profiler = state.profiler
    entered = profiler.hook_entered(bucket.index()) if profiler is not None else None
    pending, state.pending_round = state.pending_round, None
    if pending is not None:
        if pending.step != state.step:
            _fail(pending, RuntimeError("autocomp: a backward pass ended between two buckets"))
            raise RuntimeError(
                "autocomp: the previous backward pass stopped after a bucket whose second "
                "round was still pending (an exception inside backward?); the ranks can no "
                "longer be assumed to issue the same collectives"
            )
        _launch_final_round(state, pending)
    buffer = bucket.buffer()
    group = state.process_group
    world = state.world_size
    buffer.div_(world)
    layout = state.layout(bucket)
    is_last = bucket.is_last()
    sample = profiler is not None and profiler.sample_this_step

    if not state.enabled or all(state.sends_plain(s) for s in layout.slots):
        for slot, offset in zip(layout.slots, layout.offsets, strict=True):
            size = slot.numel * slot.dtype.itemsize
            slot.bytes_sent += size
            slot.bytes_raw += size
            if sample and profiler is not None:
                _sample_plain(slot, buffer[offset : offset + slot.numel], profiler)
        fut = dist.all_reduce(buffer, group=group, async_op=True).get_future()
        if profiler is not None:
            profiler.collective(Collective.ALL_REDUCE, buffer.numel() * buffer.element_size(), fut)
            profiler.hook_exited(entered)
        if is_last:
            state.step += 1
            state._in_step = False
        return fut.then(lambda f: f.value()[0])

    work = _BucketWork(
        step=state.step,
        buffer=buffer,
        profiled_step=profiler.current_step if profiler is not None else None,
    )
    reduce_parts: dict[torch.dtype, list[_Part]] = {}
    for slot, offset in zip(layout.slots, layout.offsets, strict=True):
        grad = buffer[offset : offset + slot.numel]
        if state.sends_plain(slot):
            encoding = _Encoding(slot, grad, grad, plain=True)
            if sample and profiler is not None:
                _sample_plain(slot, grad, profiler)
        else:
            started = profiler.stamp() if profiler is not None and profiler.time_layers else None
            encoding = _begin(slot, grad, state)
            if started is not None and profiler is not None:
                profiler.layer_cost(slot.name, started)
        raw = slot.numel * slot.dtype.itemsize
        slot.bytes_sent += raw if encoding.plain else slot.wire_bytes()
        slot.bytes_raw += raw
        part = _Part(encoding, offset)
        payload = encoding.payload
        if not encoding.settled:
            work.round_parts.append(part)
        elif encoding.plain or slot.compressor.collective is Collective.ALL_REDUCE:
            reduce_parts.setdefault(payload.dtype, []).append(part)
        else:
            work.gather_parts.append(part)

    # Launch order is a pure function of the plan: the first round of two-round layers (small,
    # and awaited by the next bucket's hook call, so it goes first), then one all-reduce per
    # dtype sorted by name, then the gather.
    if work.round_parts:
        work.round_flat = torch.cat([p.encoding.payload.reshape(-1) for p in work.round_parts])
        work.round_future = _all_reduce(work.round_flat, group, profiler)
    for dtype in sorted(reduce_parts, key=str):
        parts = reduce_parts[dtype]
        flat = torch.cat([p.encoding.payload.reshape(-1) for p in parts])
        work.reduce_groups.append((flat, parts))
        work.futures.append(_all_reduce(flat, group, profiler))
    if work.gather_parts:
        local = torch.cat([p.encoding.payload for p in work.gather_parts])
        work.gathered = torch.empty(world * local.numel(), dtype=torch.uint8, device=local.device)
        fut = _all_gather(work.gathered, local, group)
        work.futures.append(fut)
        if profiler is not None:
            profiler.collective(Collective.ALL_GATHER, local.numel(), fut)
    if is_last:
        state.step += 1
        state._in_step = False

    # The bucket's future is completed by hand once everything is decoded. On CUDA it names the
    # device, so completing it records an event on the stream the decode ran on, and DDP's
    # wait orders its own stream after that (a ``collect_all`` child carries no devices).
    devices = [buffer.device] if buffer.is_cuda else None
    work.result = torch.futures.Future(devices=devices)
    if not work.round_parts:
        _complete_when_done(state, work)
    elif is_last:
        # No later bucket to carry the final round: launch it now, in the same fixed order.
        _launch_final_round(state, work)
    else:
        state.pending_round = work
    if profiler is not None:
        profiler.hook_exited(entered)
    return work.result


def _all_reduce(
    flat: torch.Tensor, group: Any, profiler: StepProfiler | None
) -> torch.futures.Future:
    fut = dist.all_reduce(flat, group=group, async_op=True).get_future()
    if profiler is not None:
        profiler.collective(Collective.ALL_REDUCE, flat.numel() * flat.element_size(), fut)
    return fut


def _fail(work: _BucketWork, err: BaseException) -> None:
    if work.result is not None and not work.result.done():
        work.result.set_exception(err)


def _launch_final_round(state: HookState, work: _BucketWork) -> None:
    """Wait for a bucket's first round, compute and launch its final round (hook thread).

    Called from the next bucket's hook call (or the last bucket's own): by then the small
    first-round all-reduce has usually finished behind the backward in between. On CUDA
    ``wait`` only orders the current stream after the collective; on gloo it blocks, and the
    time is reported to the profiler as communication the backward waited for.
    """
    profiler = state.profiler
    assert work.round_future is not None and work.round_flat is not None
    waiting = profiler.stamp() if profiler is not None else None
    try:
        work.round_future.wait()
    except BaseException as err:
        _fail(work, err)
        raise
    if profiler is not None and waiting is not None:
        profiler.link_wait(waiting)
    try:
        start = 0
        payloads = []
        for part in work.round_parts:
            encoding = part.encoding
            size = encoding.payload.numel()
            received = work.round_flat[start : start + size]
            start += size
            began = profiler.stamp() if profiler is not None and profiler.time_layers else None
            _advance(encoding, received, state)
            if began is not None and profiler is not None:
                profiler.layer_cost(encoding.slot.name, began)
            payloads.append(encoding.payload.reshape(-1))
        work.final_flat = torch.cat(payloads)
    except BaseException as err:
        _fail(work, err)
        raise
    work.futures.append(_all_reduce(work.final_flat, state.process_group, profiler))
    _complete_when_done(state, work)


def _complete_when_done(state: HookState, work: _BucketWork) -> None:
    """Decode the bucket and complete its future once all its collectives are done."""
    result = work.result
    assert result is not None

    def finish(_: torch.futures.Future) -> None:
        try:
            result.set_result(_finish(state, work, state.world_size))
        except BaseException as err:  # never leave DDP waiting on a future nobody completes
            if not result.done():
                result.set_exception(err)

    torch.futures.collect_all(work.futures).add_done_callback(finish)


def _finish(state: HookState, work: _BucketWork, world: int) -> torch.Tensor:
    """Decode everything that arrived for one bucket into its buffer (completion callback)."""
    profiler = state.profiler
    for fut in work.futures:
        # Re-raise a failed collective here rather than use stale data. ``wait`` (not
        # ``value``): this runs in a callback of ``collect_all``'s future, which carries no
        # devices, so on CUDA it is what orders the current stream after each collective.
        fut.wait()
    started = profiler.stamp() if profiler is not None else None
    checks: list[tuple[int, LayerSlot, torch.Tensor]] = []
    buffer = work.buffer
    for flat, parts in work.reduce_groups:
        start = 0
        for part in parts:
            size = part.encoding.payload.numel()
            _write_back(buffer, part, flat[start : start + size], work.step, checks)
            start += size
    if work.final_flat is not None:
        start = 0
        for part in work.round_parts:
            size = part.encoding.payload.numel()
            _write_back(buffer, part, work.final_flat[start : start + size], work.step, checks)
            start += size
    if work.gathered is not None:
        rows = work.gathered.view(world, -1)
        start = 0
        for part in work.gather_parts:
            size = part.encoding.payload.numel()
            payloads = [rows[r, start : start + size] for r in range(world)]
            _write_back(buffer, part, payloads, work.step, checks)
            start += size
    state._pending_checks.extend(checks)
    if profiler is not None and started is not None:
        profiler.bucket_finished(started, work.profiled_step)
    return buffer


def decode_into(slot: LayerSlot, received: Any, target: torch.Tensor) -> torch.Tensor:
    """Decode what arrived for a compressed layer into ``target``; advance its state.

    Returns a 0-d bool tensor: whether the result is finite (read later, without a sync here).
    NaN/Inf anywhere in a rank's input reaches the summed payload (all-reduce), which is
    cheaper to check than the decoded gradient when it is float32; other payloads are checked
    once decoded (a 16-bit payload too: on CPU a float32 sum of float16 elements is 5x slower
    than of the decoded float32 ones). The check is the float32 sum, which NaN and Inf
    propagate through: one streaming pass without a full-size bool temporary (30x cheaper than
    ``isfinite().all()`` on CPU). A finite tensor whose sum overflows float32 (elements near
    1e32) also counts as non-finite, which at that size is the right reaction anyway.
    """
    slot.compressor.decompress_into(received, target, slot.shape, slot.state)
    summed = isinstance(received, torch.Tensor) and received.dtype == torch.float32
    checked = received if summed else target
    finite = torch.isfinite(checked.sum(dtype=torch.float32))
    slot.compressor.commit(received, slot.state)
    return finite


def _write_back(
    buffer: torch.Tensor,
    part: _Part,
    received: Any,
    step: int,
    checks: list[tuple[int, LayerSlot, torch.Tensor]],
) -> None:
    slot = part.encoding.slot
    target = buffer[part.offset : part.offset + slot.numel]
    if part.encoding.plain:
        target.copy_(received)
        return
    checks.append((step, slot, decode_into(slot, received, target)))


@dataclass(slots=True)
class _ReplayHookState:
    """What the encoding functions read of :class:`HookState`, for a replay without
    collectives."""

    check_wire_bytes: bool = False
    profiler: StepProfiler | None = None
    step: int = 0


class LayerReplay:
    """The hook's own per-layer work on one gradient, step after step, without the collective.

    What the cost model's calibration at ``wrap`` and the advisor's compressor measurements
    time: the exact hot path of :func:`autocomp_hook` (every round of :func:`encode_locally`,
    then :func:`decode_into` into a bucket-sized target), so a fused or unfused code path is
    costed as it really runs.
    """

    def __init__(self, compressor: Compressor, grad: torch.Tensor, gathered: int = 2) -> None:
        shape = torch.Size(grad.shape)
        self.slot = LayerSlot("replay", shape, grad.dtype, 0, compressor)
        self.slot.state = compressor.init_state(shape, 0, 0)
        self.grad = grad.reshape(-1)
        self.target = torch.empty_like(self.grad)
        self.gathered = max(1, gathered)
        """Payloads decoded per all-gather step (the per-payload time is their mean)."""
        self._state = _ReplayHookState()
        self.clock = clock_for(grad.device)

    def step(self) -> tuple[float, float]:
        """One step: (sending-side seconds, decode seconds per received payload).

        Timed with the clock of the gradient's device (CUDA events on a GPU, where host time
        would only see the kernel launches), waiting for the device at the end of the step.
        """
        slot, clock = self.slot, self.clock
        started = clock.stamp()
        payload, _ = encode_locally(slot, self.grad, self._state)
        prepared = clock.stamp()
        payloads = 1
        received: Any = payload
        if slot.compressor.collective is Collective.ALL_GATHER:
            payloads = self.gathered
            received = [payload] + [payload.clone() for _ in range(payloads - 1)]
        decode_started = clock.stamp()
        bool(decode_into(slot, received, self.target))
        finished = clock.stamp()
        self._state.step += 1
        if isinstance(finished, torch.cuda.Event):
            finished.synchronize()
        read = clock.reader(started)
        return read(prepared) - read(started), (read(finished) - read(decode_started)) / payloads
