"""The hierarchical comm hook: full precision inside a node, compression only across nodes.

Per bucket, on every rank of a job with N nodes of L ranks each:

1. **Reduce-scatter inside the node** at full precision. The bucket's layers are cut into L
   contiguous runs of about equal bytes (whole layers: a compressor such as PowerSGD needs the
   layer's matrix); local rank j owns run j. The runs are laid out in a zero-padded staging
   buffer of L equal chunks, so one ``reduce_scatter_tensor`` leaves each local rank its own
   run summed over the node. On gloo it is an all-to-all of those chunks and a sum in
   local-rank order instead (:func:`_reduce_scatter` says why).
2. **The per-layer compressed exchange across nodes** among the N ranks that own the same run
   (the ``cross`` group of :mod:`autocomp.topology`): the same encoding, collectives and
   decode as the flat hook (:func:`~autocomp.hook.exchange_now`), so every compressor works,
   PowerSGD with its two rounds included. Error feedback lives on the owner only: it is per shard.
3. **All-gather inside the node** of the decoded runs, copied back into the bucket.

Each node's slow-link traffic is every layer once (compressed), sent by the L owners in
parallel, instead of every rank's whole gradient.

Ordering. DDP calls the hook in bucket order on the autograd thread. The hook only divides,
stages and launches the reduce-scatter there (group ``intra``), then hands the bucket to an
*exchange thread*, which waits for its reduce-scatter, encodes and launches the cross-node
collectives (waiting for PowerSGD's first round before the second), and hands it on to a
*finish thread*, which waits for the decode and launches the all-gather (group
``intra_gather``). Each thread takes buckets first-in first-out, and each group is used by one
thread only, so every group sees its collectives in bucket order on every rank, whatever the
timing. The backward never waits for the slow link; the ranks' exchange threads do.

The link meter measures the cross-node link: the profiler records the cross-node collectives,
their bytes multiplied by L (the L owners of a node send concurrently over the same link), so
the bandwidth it fits is the node's. The intra-node gathers are timed separately
(:meth:`HierarchicalReduce.take_intra_samples`) and reported as the node link.

(No ``from __future__ import annotations``: DDP inspects the hook's annotations.)
"""

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from autocomp import callbacks
from autocomp.hook import BucketWork, autocomp_hook, average_in_place, exchange_now, on_stream
from autocomp.hook_layer import LayerSlot
from autocomp.hook_state import BucketLayout, HookState
from autocomp.level_probe import LevelRates
from autocomp.timing import clock_for
from autocomp.topology import HierarchyGroups

__all__ = ["HierarchicalReduce", "hierarchical_hook", "split_runs"]

logger = logging.getLogger(__name__)


def split_runs(sizes: list[int], parts: int) -> list[tuple[int, int]]:
    """Cut a sequence of layer sizes into ``parts`` contiguous runs of about equal total.

    Returns ``(first, stop)`` layer indices per run (a run may be empty). A layer joins run j
    while its midpoint lies within the first j/parts of the total (the last run takes the
    rest), so no run exceeds the ideal share by more than one layer; a pure function of the
    sizes, hence identical on every rank.
    """
    total = sum(sizes)
    runs, first, acc = [], 0, 0
    index = 0
    for j in range(1, parts + 1):
        goal = total * j / parts
        while index < len(sizes) and (acc + sizes[index] / 2 <= goal or j == parts):
            acc += sizes[index]
            index += 1
        runs.append((first, index))
        first = index
    return runs


@dataclass(slots=True)
class _ShardLayout:
    """One bucket cut into per-local-rank runs, with the buffers its hook calls reuse."""

    key: tuple[int, ...]
    bounds: list[tuple[int, int]]
    """Element range ``[start, stop)`` of every local rank's run in the bucket."""
    chunk: int
    """Elements per chunk of the staging buffer (the longest run)."""
    slots: list[LayerSlot]
    """This rank's layers."""
    offsets: list[int]
    """Their offsets inside this rank's chunk."""
    staging: torch.Tensor
    own: torch.Tensor
    received: torch.Tensor | None
    """The chunks the node's other ranks send this one, where the reduce-scatter is an
    all-to-all and a sum (:func:`sums_by_exchange`)."""


class _OrderedWorker:
    """A daemon thread running submitted jobs one at a time, first in, first out."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        # Tracked: a job completes its bucket's future, after which DDP may let the program
        # end while this thread still needs the GIL (autocomp.callbacks).
        self._jobs.put(callbacks.tracked(job))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()  # jobs catch their own errors and fail their bucket's future

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10.0)


class HierarchicalReduce:
    """The hierarchical hook's runtime: groups, shard layouts, threads, intra-node timings."""

    def __init__(
        self,
        groups: HierarchyGroups,
        rank: int,
        *,
        min_advantage: float = 0.0,
        opening_rates: LevelRates | None = None,
    ) -> None:
        self.groups = groups
        self.min_advantage = min_advantage
        """Node-to-cross-node bandwidth ratio below which the run warns (0: never)."""
        self.opening_rates = opening_rates
        """Both links as ``hierarchy="auto"`` timed them at wrap (None: not timed)."""
        self.topology = groups.topology
        self.rank = rank
        self._layouts: dict[int, _ShardLayout] = {}
        self._exchange = _OrderedWorker("autocomp-exchange")
        self._finish = _OrderedWorker("autocomp-finish")
        self._intra: list[list[Any]] = []
        """``[bytes, launched, finished]`` of each timed gather (finished set on completion)."""
        self._intra_lock = threading.Lock()
        self._clock: Any = None

    @property
    def local_world_size(self) -> int:
        return self.topology.local_world_size

    @property
    def num_nodes(self) -> int:
        return self.topology.num_nodes

    def shard_layout(self, index: int, layout: BucketLayout, buffer: torch.Tensor) -> _ShardLayout:
        cached = self._layouts.get(index)
        if cached is not None and cached.key == layout.key:
            return cached
        parts = self.local_world_size
        runs = split_runs([s.numel for s in layout.slots], parts)
        ends = [*layout.offsets[1:], buffer.numel()]
        bounds = []
        for first, stop in runs:
            start = layout.offsets[first] if first < len(layout.slots) else buffer.numel()
            end = ends[stop - 1] if stop > first else start
            bounds.append((start, end))
        chunk = max(1, max(end - start for start, end in bounds))
        mine = runs[self.topology.local_rank]
        base = bounds[self.topology.local_rank][0]
        shard = _ShardLayout(
            key=layout.key,
            bounds=bounds,
            chunk=chunk,
            slots=layout.slots[mine[0] : mine[1]],
            offsets=[o - base for o in layout.offsets[mine[0] : mine[1]]],
            staging=torch.zeros(parts * chunk, dtype=buffer.dtype, device=buffer.device),
            own=torch.zeros(chunk, dtype=buffer.dtype, device=buffer.device),
            received=(
                torch.zeros(parts * chunk, dtype=buffer.dtype, device=buffer.device)
                if sums_by_exchange(self.groups.intra, buffer)
                else None
            ),
        )
        # DDP rebuilds its buckets after the first iteration, which can move a layer to another
        # local rank. What a former owner kept for it (error feedback, warm starts) is dropped:
        # the new owner starts afresh, as after a switch of compressor.
        owned = set(map(id, shard.slots))
        for slot in layout.slots:
            if id(slot) not in owned and (slot.residual is not None or slot.state):
                slot.residual = None
                slot.state = slot.compressor.init_state(slot.shape, slot.seed, self.rank)
        self._layouts[index] = shard
        return shard

    def owned(self) -> set[str]:
        """Layers this rank exchanges across nodes (error feedback and samples live here)."""
        return {slot.name for shard in self._layouts.values() for slot in shard.slots}

    # ---- intra-node timing -------------------------------------------------------------------

    def _time_intra(self, buffer: torch.Tensor, payload_bytes: int, fut: Any) -> None:
        if self._clock is None:
            self._clock = clock_for(buffer.device)
        clock = self._clock
        entry = [payload_bytes, clock.stamp(), None]

        def done(_: Any) -> None:
            entry[2] = clock.stamp()

        callbacks.add_done_callback(fut, done)
        with self._intra_lock:
            self._intra.append(entry)

    def take_intra_samples(self) -> list[tuple[int, float]]:
        """``(bytes per rank, seconds)`` of the intra-node collectives finished since last
        asked (their stamps read once, at the window boundary)."""
        with self._intra_lock:
            entries, self._intra = self._intra, []
        if not entries or self._clock is None:
            return []
        clock = self._clock
        ready, pending = [], []
        for entry in entries:
            done = entry[2] is not None and clock.ready((entry[1], entry[2]))
            (ready if done else pending).append(entry)
        if pending:  # still in flight (a device clock): read at the next window
            with self._intra_lock:
                self._intra[:0] = pending
        samples = []
        for payload_bytes, started, finished in ready:
            read = clock.reader(started)
            samples.append((payload_bytes, max(read(finished), 1e-9)))
        return samples

    def close(self) -> None:
        self._exchange.stop()
        self._finish.stop()


def hierarchical_hook(
    state: HookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook of the two-level reduce; see the module docstring."""
    hierarchy = state.hierarchy
    assert hierarchy is not None, "hierarchical_hook needs a HookState with a hierarchy"
    if not state.enabled:  # closed: a plain flat all-reduce, as the flat hook does then
        return autocomp_hook(state, bucket)
    state.enter_hook()
    profiler = state.profiler
    entered = profiler.hook_entered(bucket.index()) if profiler is not None else None
    buffer = bucket.buffer()
    average_in_place(buffer, state.world_size)
    layout = state.layout(bucket)
    shard = hierarchy.shard_layout(bucket.index(), layout, buffer)
    chunk = shard.chunk
    for j, (start, stop) in enumerate(shard.bounds):
        shard.staging[j * chunk : j * chunk + stop - start].copy_(buffer[start:stop])
    # gloo's reduce-scatter work has no future: the exchange thread waits on the work itself.
    # (The node link is timed on the gathers, whose completion callbacks stamp the transfer.)
    scatter = _reduce_scatter(shard.own, shard.staging, hierarchy.groups.intra, shard.received)
    devices = [buffer.device] if buffer.is_cuda else None
    result: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=devices)
    work = BucketWork(
        step=state.step,
        buffer=shard.own,
        group=hierarchy.groups.cross,
        world=hierarchy.num_nodes,
        link_share=hierarchy.local_world_size,
        profiled_step=profiler.current_step if profiler is not None else None,
    )
    sample = profiler is not None and profiler.sample_this_step
    stream = work.stream

    def exchange() -> None:
        try:
            with on_stream(stream):
                scatter.wait()
                exchange_now(state, work, shard.slots, shard.offsets, sample)
        except BaseException as err:
            _fail_bucket(result, err)
            return
        hierarchy._finish.submit(finish)

    def finish() -> None:
        try:
            with on_stream(stream):
                assert work.result is not None
                work.result.wait()
                gather = _all_gather(shard.staging, shard.own, hierarchy.groups.intra_gather)
                if profiler is not None:  # only a window loop reads (and drains) them
                    staged = shard.staging.numel() * shard.staging.element_size()
                    hierarchy._time_intra(buffer, staged, gather)
                gather.wait()
                for j, (start, stop) in enumerate(shard.bounds):
                    buffer[start:stop].copy_(shard.staging[j * chunk : j * chunk + stop - start])
                result.set_result(buffer)
        except BaseException as err:
            _fail_bucket(result, err)

    hierarchy._exchange.submit(exchange)
    if bucket.is_last():
        state.step += 1
        state._in_step = False
    if profiler is not None and entered is not None:
        profiler.hook_exited(entered)
    return result


def _reduce_scatter(
    output: torch.Tensor, source: torch.Tensor, group: Any, received: torch.Tensor | None = None
) -> Any:
    """Launch the node's reduce-scatter of ``source`` (L equal chunks) into ``output``.

    With ``received`` (a buffer shaped like ``source``), it is an all-to-all followed by a sum
    in local-rank order, done in :meth:`_SummedExchange.wait`. On gloo that is about twice as
    fast as gloo's own reduce-scatter, which took 24-27 ms for 24 MB between two loopback
    ranks against 11-12 ms (and a plain all-reduce of all 24 MB 15-17 ms). NCCL's reduce-scatter
    is the bandwidth-optimal one, and is used as it is.
    """
    if received is not None:
        work = dist.all_to_all_single(received, source, group=group, async_op=True)
        return _SummedExchange(work, received, output)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, source, group=group, async_op=True)


class _SummedExchange:
    """An all-to-all's work that, once waited for, sums the received chunks into the output.

    The sum runs on the waiting thread (the exchange thread), in local-rank order, so each
    owner's node sum does not depend on timing.
    """

    def __init__(self, work: Any, received: torch.Tensor, output: torch.Tensor) -> None:
        self._work = work
        self._received = received
        self._output = output

    def wait(self) -> bool:
        self._work.wait()
        chunks = self._received.view(-1, self._output.numel())
        self._output.copy_(chunks[0])
        for chunk in chunks[1:]:
            self._output.add_(chunk)
        return True


def sums_by_exchange(group: Any, tensor: torch.Tensor) -> bool:
    """Whether the node's reduce-scatter is done as an all-to-all and a sum (gloo, CPU)."""
    return not tensor.is_cuda and dist.get_backend(group) == "gloo"


def _all_gather(output: torch.Tensor, source: torch.Tensor, group: Any) -> torch.futures.Future:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, source, group=group, async_op=True).get_future()


def _fail_bucket(result: torch.futures.Future, err: BaseException) -> None:
    logger.error("autocomp: hierarchical reduce of a bucket failed: %s", err)
    if not result.done():
        result.set_exception(err)
