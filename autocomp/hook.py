"""The one DDP comm hook: per-layer compression inside each bucket.

DDP allows a single comm hook per model, so this hook dispatches every gradient of a bucket to
its own layer's compressor. Per bucket it issues at most one all-reduce per payload dtype
(in a fixed dtype order) followed by at most one all-gather of opaque bytes. Every collective
is launched synchronously from a hook call, never from a future callback, and DDP calls the
hook in bucket order on every rank; with identical plans (checked at ``wrap``), every rank
therefore issues the same collectives, with the same sizes, in the same order.

Two-round compressors (PowerSGD: P, then Q computed from the summed P) are pipelined across
buckets. Bucket b's hook call launches the first round of its two-round layers ahead of its
other collectives; bucket b+1's hook call waits for that round, computes bucket b's final
round and launches it in one all-reduce with its own first round and, when they are no
larger than the rounds, its plain all-reduce parts of that dtype (biases, norms), then
proceeds with the rest; the last bucket puts all its plain parts into that one and runs its
final round at once. The order is again a pure function of the plan and the bucket order
(``+`` joins payloads of one all-reduce, where their dtypes agree; ``[rest_b]`` joins only
when small):

    P_0[+rest_0] | Q_0+P_1[+rest_1] | ... | Q_{n-1}+P_n+rest_n, Q_n

so it holds on gloo and NCCL with any number of buckets (PyTorch's own hook launches Q from a
callback, which reorders across ranks when buckets complete in different orders). A bucket's
other collectives (payload dtypes of their own, the all-gather) follow its first round; in the
last bucket they are launched only once that round is done, since gloo would otherwise run them
beside it and slow the round the step's tail waits for (:func:`launch_bucket`). Bucket b's
future is completed by hand once its final round is decoded. The wait in bucket b+1's call
is short when the backward between the two buckets covers the small P all-reduce; on CUDA it
only orders the compute stream after the collective.

Gradients are scaled by ``1 / world`` before compression (:func:`average_in_place`), so
summing what all ranks sent yields the average. Biased compressors keep an error-feedback
residual per parameter, keyed by parameter name so it survives DDP's bucket rebuild after
the first iteration.

Non-finite gradients: after the collectives, each compressed layer's decoded average is checked
(identical on every rank, so every rank reacts identically). A layer whose average is NaN/Inf
gets its error feedback and compressor state reset, and is sent uncompressed on the next step;
the non-finite average itself reaches the optimizer exactly as plain DDP would deliver it, so
AMP's GradScaler still sees it and skips the step.

On the CPU, consecutive layers on one 16-bit cast are encoded and decoded as one part
(:mod:`autocomp.hook_cast_span`), which sends the same bytes as the layers would one by one;
a bucket that is one such part goes through none of the machinery above
(:func:`~autocomp.hook_cast_span.exchange_cast_bucket`).

This module is the bucket-level machinery: the collectives, the two-round pipeline and the
write-back. One layer's encode and decode (and their replay without collectives) are in
:mod:`autocomp.hook_layer`; the per-parameter slots and bucket layouts in
:mod:`autocomp.hook_state`.

(No ``from __future__ import annotations`` here: DDP inspects the hook's annotations at
registration and rejects string annotations.)
"""

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from autocomp import callbacks
from autocomp.compressors import Collective
from autocomp.hook_cast_span import (
    CastSpan,
    decode_cast_span,
    encode_counted,
    exchange_cast_bucket,
    fills_bucket,
    find_cast_spans,
)
from autocomp.hook_layer import (
    Encoding,
    LayerSlot,
    advance_encoding,
    begin_encoding,
    decode_into,
    sample_plain,
)
from autocomp.hook_state import HookState
from autocomp.profiler import StepProfiler

__all__ = [
    "BucketWork",
    "autocomp_hook",
    "average_in_place",
    "complete_when_done",
    "encode_bucket",
    "exchange_now",
    "launch_bucket",
    "launch_deferred",
    "launch_final_round",
    "launch_prepared_round",
    "on_stream",
    "prepare_final_round",
    "sparse_bytes",
]


def _all_gather(output: torch.Tensor, payload: torch.Tensor, group: Any) -> torch.futures.Future:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, payload, group=group, async_op=True).get_future()


@dataclass(slots=True)
class _Part:
    encoding: Encoding
    offset: int
    span: CastSpan | None = None
    """The cast span the layer was encoded in (:mod:`autocomp.hook_cast_span`), if any."""


@dataclass(slots=True)
class BucketWork:
    """One bucket's collectives in flight, until its result is written back."""

    step: int
    buffer: torch.Tensor
    group: Any
    """Process group of this bucket's (compressed) collectives."""
    world: int
    """Ranks in ``group``: payloads an all-gather returns."""
    link_share: int = 1
    """Ranks whose collectives share this link concurrently (bytes are reported times this)."""
    profiled_step: Any = None
    """The profiler's record of the step (decode may finish after the next step began)."""
    futures: list[torch.futures.Future] = field(default_factory=list)
    reduce_groups: list[tuple[torch.Tensor, list[_Part]]] = field(default_factory=list)
    gather_parts: list[_Part] = field(default_factory=list)
    gathered: torch.Tensor | None = None
    deferred: dict[torch.dtype, list[_Part]] = field(default_factory=dict)
    """All-reduce parts :func:`launch_bucket` left for :func:`launch_deferred`, one
    collective per payload dtype in launch order; the gather, while ``gathered`` is None,
    follows them."""
    round_parts: list[_Part] = field(default_factory=list)
    """Two-round layers: round 0 in ``round_flat``, the final round later in ``final_flat``."""
    round_flat: torch.Tensor | None = None
    round_future: torch.futures.Future | None = None
    final_flat: torch.Tensor | None = None
    result: torch.futures.Future | None = None
    """Completed by hand once the final round is decoded (two-round buckets only)."""
    stream: Any = None
    """The CUDA stream the bucket is encoded on (the creating thread's current one); its
    decode runs there too. None on the CPU."""

    def __post_init__(self) -> None:
        if self.stream is None and self.buffer.is_cuda:
            self.stream = torch.cuda.current_stream(self.buffer.device)

    def release_payloads(self) -> None:
        """Free what was sent and received once decoded: the decode's function is released
        later, off the worker thread (:mod:`autocomp.callbacks`), and must not keep a
        bucket's payloads alive through the next forward."""
        self.futures = []
        self.reduce_groups = []
        self.gather_parts = []
        self.gathered = None
        self.deferred = {}
        self.round_parts = []
        self.round_flat = None
        self.round_future = None
        self.final_flat = None


def average_in_place(buffer: torch.Tensor, world: int) -> None:
    """Scale a bucket so that the all-reduce's sum is the ranks' mean, as DDP does without a
    hook.

    DDP's reducer multiplies each dense gradient by ``1 / world`` as it copies it into the
    bucket (and divides a sparse one); a hook gets the unscaled copy and must scale it itself.
    Doing it the same way gives uncompressed layers plain DDP's bits at any world size
    (``x / 3`` and ``x * (1 / 3)`` differ in the last place), and on the CPU the multiply is
    the cheaper pass: 0.16 against 0.29 ms on a 14 MB bucket, one thread.
    """
    if world == 1:
        return
    if buffer.is_sparse:
        buffer.div_(world)
    else:
        buffer.mul_(1.0 / world)


def _bucket_tensor(fut: torch.futures.Future) -> torch.Tensor:
    """The all-reduced bucket: the value a DDP comm hook's future must carry."""
    return fut.value()[0]


def autocomp_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook applying each parameter's compressor; see the module docstring."""
    state.enter_hook()
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
        # Its final round rides on this bucket's first collective (launched below).
        prepare_final_round(state, pending)
    buffer = bucket.buffer()
    group = state.process_group
    world = state.world_size
    average_in_place(buffer, world)
    layout = state.layout(bucket)
    is_last = bucket.is_last()
    sample = profiler is not None and profiler.sample_this_step

    if not state.enabled or all(state.sends_plain(s) for s in layout.slots):
        if pending is not None:
            launch_prepared_round(state, pending)
        sparse = buffer.is_sparse  # one embedding's sparse gradient, alone in its bucket
        for slot, offset in zip(layout.slots, layout.offsets, strict=True):
            size = sparse_bytes(buffer) if sparse else slot.numel * slot.dtype.itemsize
            if sparse:
                slot.sparse_step_bytes = size
            slot.bytes_sent += size
            slot.bytes_raw += size
            if sample and profiler is not None:
                grad = buffer if sparse else buffer[offset : offset + slot.numel]
                sample_plain(slot, grad, profiler)
        fut = dist.all_reduce(buffer, group=group, async_op=True).get_future()
        record = None
        if profiler is not None:
            # A sparse all-reduce gathers every rank's indices and values: not an all-reduce
            # of its bytes, so the link meter does not see it (the step still times it).
            if not sparse:
                nbytes = buffer.numel() * buffer.element_size()
                record = profiler.launched(Collective.ALL_REDUCE, nbytes)
            profiler.hook_exited(entered)
        if is_last:
            state.step += 1
            state._in_step = False
        if record is None or profiler is None:
            return callbacks.then(fut, _bucket_tensor)
        clock = profiler.clock

        def stamped(f: torch.futures.Future) -> torch.Tensor:
            # The collective's end, stamped in the one callback DDP needs anyway (on CUDA,
            # on a stream that waits for the transfer): a second callback for the stamp
            # would cost gloo's worker another turn of the GIL per bucket.
            record.done = clock.stamp()
            return _bucket_tensor(f)

        return callbacks.then(fut, stamped)

    spans = find_cast_spans(layout.slots, layout.offsets, state.step, buffer, sample)
    whole = spans.get(0)
    if pending is None and whole is not None and fills_bucket(whole, buffer):
        result = exchange_cast_bucket(state, whole, buffer)
        if profiler is not None:
            profiler.hook_exited(entered)
        if is_last:
            state.step += 1
            state._in_step = False
        return result

    work = BucketWork(
        step=state.step,
        buffer=buffer,
        group=group,
        world=world,
        profiled_step=profiler.current_step if profiler is not None else None,
    )
    try:
        reduce_parts = encode_bucket(state, work, layout.slots, layout.offsets, sample, spans)
    except BaseException as err:
        if pending is not None:
            _fail(pending, err)
        raise
    # The last bucket's plain parts join its first round too: its final round waits for
    # that round at once, so nothing is gained by sending them apart.
    launch_bucket(
        work, reduce_parts, profiler, carried=pending, merge_rest=is_last, defer_rest=is_last
    )
    if pending is not None:
        complete_when_done(state, pending)
    if is_last:
        state.step += 1
        state._in_step = False

    # The bucket's future is completed by hand once everything is decoded. On CUDA it names the
    # device, so completing it records an event on the stream the decode ran on, and DDP's
    # wait orders its own stream after that (a ``collect_all`` child carries no devices).
    devices = [buffer.device] if buffer.is_cuda else None
    work.result = torch.futures.Future(devices=devices)
    if not work.round_parts:
        complete_when_done(state, work)
    elif is_last:
        # No later bucket to carry the final round: launch it now, in the same fixed order.
        launch_final_round(state, work)
    else:
        state.pending_round = work
    if profiler is not None:
        profiler.hook_exited(entered)
    return work.result


def exchange_now(
    state: HookState,
    work: BucketWork,
    slots: list[LayerSlot],
    offsets: list[int],
    sample: bool = False,
    blocks_backward: bool = False,
) -> torch.futures.Future[torch.Tensor]:
    """The whole compressed exchange of ``work.buffer`` issued from the calling thread, for
    callers outside DDP's bucket pipeline (the hierarchical hook's exchange thread, FSDP's
    all-reduce hook): every collective launched here, a two-round layer's final round after
    waiting for its first. Returns the future completed once the result is decoded in place.
    ``blocks_backward``: the caller holds up the backward meanwhile (FSDP's hook), so the wait
    for a first round is reported to the profiler as exposed communication.
    """
    reduce_parts = encode_bucket(state, work, slots, offsets, sample)
    launch_bucket(work, reduce_parts, state.profiler, defer_rest=True)
    devices = [work.buffer.device] if work.buffer.is_cuda else None
    work.result = torch.futures.Future(devices=devices)
    if work.round_parts:
        launch_final_round(state, work, blocks_backward=blocks_backward)
    else:
        complete_when_done(state, work)
    return work.result


def encode_bucket(
    state: HookState,
    work: BucketWork,
    slots: list[LayerSlot],
    offsets: list[int],
    sample: bool,
    spans: dict[int, CastSpan] | None = None,
) -> dict[torch.dtype, list[_Part]]:
    """First round of every layer of ``work.buffer``; sorts the parts by the collective they
    need (two-round layers into ``work.round_parts``, opaque payloads into
    ``work.gather_parts``) and returns the all-reduce parts by payload dtype. ``spans``: the
    bucket's cast spans, when the caller has found them already."""
    profiler = state.profiler
    buffer = work.buffer
    reduce_parts: dict[torch.dtype, list[_Part]] = {}
    sampling = sample or (profiler is not None and profiler.sample_this_step)
    # Consecutive layers on one 16-bit cast are encoded as one (a span), in their place.
    if spans is None:
        spans = find_cast_spans(slots, offsets, work.step, buffer, sampling)
    span_left = 0
    for index, (slot, offset) in enumerate(zip(slots, offsets, strict=True)):
        span = spans.get(index)
        if span is not None:
            _encode_span(state, span, work, reduce_parts)
            span_left = len(span.slots)
        if span_left:
            span_left -= 1
            continue
        grad = buffer[offset : offset + slot.numel]
        if state.sends_plain(slot, work.step):
            encoding = Encoding(slot, grad, grad, plain=True)
            if sample and profiler is not None:
                sample_plain(slot, grad, profiler)
        else:
            started = profiler.stamp() if profiler is not None and profiler.time_layers else None
            encoding = begin_encoding(slot, grad, state, work.step)
            if started is not None and profiler is not None:
                profiler.layer_cost(slot.name, started)
        raw = slot.numel * slot.dtype.itemsize
        slot.bytes_sent += raw if encoding.plain else slot.wire_bytes()
        slot.bytes_raw += raw
        part = _Part(encoding, offset)
        if not encoding.settled:
            work.round_parts.append(part)
        elif encoding.plain or slot.compressor.collective is Collective.ALL_REDUCE:
            reduce_parts.setdefault(encoding.payload.dtype, []).append(part)
        else:
            work.gather_parts.append(part)
    return reduce_parts


def _encode_span(
    state: HookState,
    span: CastSpan,
    work: BucketWork,
    reduce_parts: dict[torch.dtype, list[_Part]],
) -> None:
    encoding = encode_counted(state, span, work.buffer, work.step)
    reduce_parts.setdefault(span.wire_dtype, []).append(_Part(encoding, span.offset, span))


def launch_bucket(
    work: BucketWork,
    reduce_parts: dict[torch.dtype, list[_Part]],
    profiler: StepProfiler | None,
    *,
    carried: BucketWork | None = None,
    merge_rest: bool = False,
    defer_rest: bool = False,
) -> None:
    """Launch a bucket's first-round collectives, in an order that is a pure function of the
    plan and the bucket order: ``carried``'s final round (the previous bucket's, prepared by
    :func:`prepare_final_round`) and this bucket's first round, in one all-reduce when their
    dtypes agree (both small, and each awaited: the final round by the previous bucket, the
    first by the next hook call); this bucket's all-reduce parts of that dtype join it when
    they are no larger than the rounds, or always with ``merge_rest``; then one all-reduce
    per remaining dtype sorted by name, then the gather. The caller completes ``carried``
    (:func:`complete_when_done`) afterwards.

    Merging saves a collective's latency per bucket boundary: on the digits CNN's two DDP
    buckets (2 gloo ranks, loopback) the chain after the last bucket's hook call was four
    collectives (the previous final round, the first round, the plain parts, the final round).

    ``defer_rest``: when this bucket has a first round and the caller waits for it at once
    (the last bucket, :func:`exchange_now`), the collectives after the first round are
    launched only once it is done (:func:`prepare_final_round`), in the same order. gloo runs
    collectives of one group concurrently, so launched together they share the link with the
    round the final round waits for, and every millisecond they take from it lands on the
    step's tail (the GPT LM at 50 Mbit/s, int8 on three layers of the last bucket: its first
    round took 35 ms beside the all-gather instead of 13 alone; docs/benchmarks-history.md).
    Launched after the wait they run while the final round is computed, as the exposure model
    assumes (one link serving collectives in launch order). On NCCL, whose collectives run
    in launch order on one stream, the wait does not block the host and nothing changes.
    """
    lead: list[tuple[str, torch.Tensor]] = []
    if carried is not None:
        assert carried.final_flat is not None
        lead.append(("final", carried.final_flat))
    if work.round_parts:
        lead.append(("round", _flat(work.round_parts)))
    rest = sorted(reduce_parts, key=str)
    dtype = lead[-1][1].dtype if lead else None
    if dtype is not None and dtype in reduce_parts:
        plain = sum(p.encoding.payload.numel() for p in reduce_parts[dtype])
        # Small plain parts (biases, norms) ride along anywhere: the wait for the first round
        # grows by no more than the round itself. Large ones only in the last bucket.
        if merge_rest or plain <= sum(tensor.numel() for _, tensor in lead):
            lead.append(("rest", _flat(reduce_parts[dtype])))
            rest.remove(dtype)
    start_of_run = 0
    for index in range(1, len(lead) + 1):
        if index < len(lead) and lead[index][1].dtype == lead[start_of_run][1].dtype:
            continue
        run = lead[start_of_run:index]
        start_of_run = index
        flat = run[0][1] if len(run) == 1 else torch.cat([tensor for _, tensor in run])
        fut = _all_reduce(flat, work, profiler)
        offset = 0
        for role, tensor in run:
            view = flat[offset : offset + tensor.numel()]
            offset += tensor.numel()
            if role == "final":
                assert carried is not None
                carried.final_flat = view
                carried.futures.append(fut)
            elif role == "round":
                work.round_flat = view
                work.round_future = fut
            else:
                work.reduce_groups.append((view, reduce_parts[view.dtype]))
                work.futures.append(fut)
    work.deferred = {dtype: reduce_parts[dtype] for dtype in rest}
    if not (defer_rest and work.round_parts):
        launch_deferred(work, profiler)


def launch_deferred(work: BucketWork, profiler: StepProfiler | None) -> None:
    """Launch what :func:`launch_bucket` queued after the first round and is not yet
    launched: one all-reduce per remaining payload dtype, sorted by name, then the gather."""
    deferred, work.deferred = work.deferred, {}
    for parts in deferred.values():
        flat = _flat(parts)
        work.reduce_groups.append((flat, parts))
        work.futures.append(_all_reduce(flat, work, profiler))
    if work.gather_parts and work.gathered is None:
        local = torch.cat([p.encoding.payload for p in work.gather_parts])
        work.gathered = torch.empty(
            work.world * local.numel(), dtype=torch.uint8, device=local.device
        )
        fut = _all_gather(work.gathered, local, work.group)
        work.futures.append(fut)
        if profiler is not None:
            profiler.collective(Collective.ALL_GATHER, local.numel() * work.link_share, fut)


def sparse_bytes(tensor: torch.Tensor) -> int:
    """What a rank contributes of a sparse COO tensor: its values and int64 indices."""
    values, indices = tensor._values(), tensor._indices()
    return values.numel() * values.element_size() + indices.numel() * indices.element_size()


def _flat(parts: list[_Part]) -> torch.Tensor:
    """The parts' payloads as one contiguous tensor for a collective that sums in place.

    A single part is sent as it is: a payload is either a tensor of the compressor's own
    (``Compressor.compress``'s contract) or, for a plain layer, a slice of the bucket that
    the sum may overwrite, as DDP's own all-reduce does, or the residual it flushes, which
    the layer has already let go (``begin_encoding``).
    """
    if len(parts) == 1:
        payload = parts[0].encoding.payload
        if payload.is_contiguous():
            return payload.view(-1)
    return torch.cat([p.encoding.payload.reshape(-1) for p in parts])


def _all_reduce(
    flat: torch.Tensor, work: BucketWork, profiler: StepProfiler | None
) -> torch.futures.Future:
    fut = dist.all_reduce(flat, group=work.group, async_op=True).get_future()
    if profiler is not None:
        size = flat.numel() * flat.element_size() * work.link_share
        profiler.collective(Collective.ALL_REDUCE, size, fut)
    return fut


def on_stream(stream: Any) -> contextlib.AbstractContextManager[Any]:
    """Make ``stream`` current on a CUDA device (a worker thread, a future's callback); on the
    CPU (``None``) do nothing."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _fail(work: BucketWork, err: BaseException) -> None:
    if work.result is not None and not work.result.done():
        work.result.set_exception(err)


def launch_final_round(state: HookState, work: BucketWork, blocks_backward: bool = True) -> None:
    """Wait for a bucket's first round, compute and launch its final round on its own
    (the last bucket's, and every bucket's outside DDP's pipeline)."""
    prepare_final_round(state, work, blocks_backward)
    launch_prepared_round(state, work)


def launch_prepared_round(state: HookState, work: BucketWork) -> None:
    """Launch a final round :func:`prepare_final_round` computed, alone, and complete the
    bucket once it is decoded."""
    assert work.final_flat is not None
    work.futures.append(_all_reduce(work.final_flat, work, state.profiler))
    complete_when_done(state, work)


def prepare_final_round(state: HookState, work: BucketWork, blocks_backward: bool = True) -> None:
    """Wait for a bucket's first round and compute its final round's payload into
    ``work.final_flat`` (hook thread); launching it is the caller's.

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
    if profiler is not None and waiting is not None and blocks_backward:
        profiler.link_wait(waiting)
    # What the bucket held back for after its first round goes on the link now, while the
    # final round is computed (``launch_bucket``'s ``defer_rest``).
    launch_deferred(work, profiler)
    try:
        start = 0
        payloads = []
        for part in work.round_parts:
            encoding = part.encoding
            size = encoding.payload.numel()
            received = work.round_flat[start : start + size]
            start += size
            began = profiler.stamp() if profiler is not None and profiler.time_layers else None
            advance_encoding(encoding, received, state)
            if began is not None and profiler is not None:
                profiler.layer_cost(encoding.slot.name, began)
            payloads.append(encoding.payload.reshape(-1))
        work.final_flat = torch.cat(payloads)
    except BaseException as err:
        _fail(work, err)
        raise


def complete_when_done(state: HookState, work: BucketWork) -> None:
    """Decode the bucket and complete its future once all its collectives are done."""
    result = work.result
    assert result is not None

    def finish(_: torch.futures.Future) -> None:
        try:
            # On the bucket's own stream, not the pool stream a CUDA future's callback runs on:
            # the decode reads tensors the encode allocated on that stream (PowerSGD's basis,
            # random-k's indices) and frees them when it commits. Freed from a foreign stream,
            # the caching allocator hands their blocks to the encode stream's next allocation
            # while the decode may still be queued to read them. (4 gloo ranks on one H200,
            # 2026-11-26: the two nodes' owners of a layer decoded different values in 5 of 30
            # hierarchy runs, and 4 runs died of a device-side assert on a corrupted index.)
            with on_stream(work.stream):
                try:
                    result.set_result(_finish(state, work))
                finally:
                    work.release_payloads()
        except BaseException as err:  # never leave DDP waiting on a future nobody completes
            if not result.done():
                result.set_exception(err)

    callbacks.add_done_callback(torch.futures.collect_all(work.futures), finish)


def _finish(state: HookState, work: BucketWork) -> torch.Tensor:
    """Decode everything that arrived for one bucket into its buffer (completion callback)."""
    profiler = state.profiler
    for fut in work.futures:
        # Re-raise a failed collective here rather than use stale data. ``wait`` (not
        # ``value``): this runs in a callback of ``collect_all``'s future, which carries no
        # devices, so on CUDA it is what orders the current stream after each collective.
        fut.wait()
    started = profiler.stamp() if profiler is not None else None
    # Each layer's decode is part of its hook cost: the cost model's prior and the opening's
    # calibration both price compress + decode, so a sample without the decode would teach
    # it a cost too low (the MLP LM at 200 Mbit/s: the layers' timed work summed to 8.1 ms
    # of the 14.3 ms the steps spent compressing and decoding).
    timer = profiler if profiler is not None and profiler.time_layers else None
    checks: list[tuple[int, LayerSlot, torch.Tensor]] = []
    buffer = work.buffer
    step = work.step
    for flat, parts in work.reduce_groups:
        start = 0
        for part in parts:
            size = part.encoding.payload.numel()
            span = part.span
            if span is None:
                _write_back(buffer, part, flat[start : start + size], step, checks, timer)
            else:
                began = timer.stamp() if timer is not None else None
                bad = decode_cast_span(span, flat[start : start + size], buffer)
                checks.extend((step, slot, flag) for slot, flag in bad)
                if timer is not None and began is not None:
                    timer.shared_cost([(s.name, s.numel) for s in span.slots], began)
            start += size
    if work.final_flat is not None:
        start = 0
        for part in work.round_parts:
            size = part.encoding.payload.numel()
            _write_back(buffer, part, work.final_flat[start : start + size], step, checks, timer)
            start += size
    if work.gathered is not None:
        world = work.world
        rows = work.gathered.view(world, -1)
        start = 0
        for part in work.gather_parts:
            size = part.encoding.payload.numel()
            payloads = [rows[r, start : start + size] for r in range(world)]
            _write_back(buffer, part, payloads, step, checks, timer)
            start += size
    state.add_checks(checks)
    if profiler is not None and started is not None:
        profiler.bucket_finished(started, work.profiled_step)
    return buffer


def _write_back(
    buffer: torch.Tensor,
    part: _Part,
    received: Any,
    step: int,
    checks: list[tuple[int, LayerSlot, torch.Tensor]],
    timer: StepProfiler | None = None,
) -> None:
    slot = part.encoding.slot
    target = buffer[part.offset : part.offset + slot.numel]
    if part.encoding.plain:
        target.copy_(received)
        return
    began = timer.stamp() if timer is not None else None
    checks.append((step, slot, decode_into(slot, received, target)))
    if timer is not None and began is not None:
        timer.layer_cost(slot.name, began)
