"""What the comm hook keeps between calls: per-parameter slots, bucket layouts, the step count.

:class:`HookState` is the handle the controller, the adaptive loop and the advisor hold: they
switch compressors through it (:meth:`HookState.assign`), attach a profiler and a step
listener, and read the non-finite events. The hook itself (:mod:`autocomp.hook`) only reads
and advances it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from autocomp.compressors import Compressor, effective_compressor
from autocomp.hook_layer import LayerSlot, is_identity
from autocomp.profiler import StepProfiler

if TYPE_CHECKING:
    from autocomp.hook import BucketWork
    from autocomp.hook_hierarchy import HierarchicalReduce

__all__ = ["BucketLayout", "HookState"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class BucketLayout:
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
        self.pending_round: BucketWork | None = None
        """A bucket whose final round the next bucket's hook call launches."""
        self.hierarchy: HierarchicalReduce | None = None
        """Set when gradients are reduced inside each node first (the hierarchical hook)."""
        self.sketch_errors = True
        """On sampled steps, sketch each compressed layer's input and loss so that the window
        can estimate the averaged update's error (:mod:`autocomp.error_sketch`)."""
        self._layouts: dict[int, BucketLayout] = {}
        self._pending_checks: list[tuple[int, LayerSlot, torch.Tensor]] = []
        self._pending_reads: list[tuple[int, torch.Tensor, Any]] = []
        """CUDA only: (checks covered, pinned host flag, event) per decoded bucket."""
        self._checked_step = 0

    def __reduce__(self) -> tuple[type[None], tuple[()]]:
        """Copies and pickles as None: a copy of a wrapped DDP model (``copy.deepcopy``,
        ``torch.save``) is plain DDP, since PyTorch registers no comm hook on a DDP copy; its
        copy of the hook list must not drag along this state, its process group included."""
        return (type(None), ())

    @property
    def link_group(self) -> dist.ProcessGroup | None:
        """The group whose link the compressed collectives cross (the policy's link)."""
        return self.hierarchy.groups.cross if self.hierarchy is not None else self.process_group

    @property
    def link_world_size(self) -> int:
        """Ranks in :attr:`link_group`: the world size of the policy's link model."""
        return self.hierarchy.num_nodes if self.hierarchy is not None else self.world_size

    @property
    def link_share(self) -> int:
        """Ranks sending concurrently over one instance of that link (a node's owners)."""
        return self.hierarchy.local_world_size if self.hierarchy is not None else 1

    @property
    def sparse_names(self) -> list[str]:
        """Layers whose gradient DDP hands over sparse (never compressed), in slot order."""
        return [name for name, slot in self.slots.items() if slot.sparse]

    def enter_hook(self) -> None:
        """First thing of every hook call: last step's non-finite flags, then, at the first
        call of a step, the step listener (window boundaries), before any of its collectives."""
        self.resolve_nonfinite()
        if not self._in_step:
            self._in_step = True
            if self.step_listener is not None:
                self.step_listener(self.step)

    def disable(self) -> None:
        """Stop compressing for good (``close()``): the hook sends plain averages from the
        next call on, and every layer's residual and compressor state is freed."""
        self.enabled = False
        if self.hierarchy is not None:
            self.hierarchy.close()  # after its queued buckets; the hook is flat from now
        for slot in self.slots.values():
            slot.residual = None
            slot.state = {}

    def add_checks(self, checks: list[tuple[int, LayerSlot, torch.Tensor]]) -> None:
        """Queue a decoded bucket's finiteness flags for :meth:`resolve_nonfinite`.

        On CUDA they are also folded into one flag now, copied to pinned host memory without
        blocking and marked with an event, so the next step waits only for this decode. Folding
        them at the next step instead queued the read behind that step's forward: on an H100
        the host stalled ~2 ms a step there, and the GPU then idled while it launched the rest
        of the backward (GPT, PowerSGD rank 4, 2026-11-24).
        """
        if not checks:
            return
        self._pending_checks.extend(checks)
        device = checks[0][2].device
        if device.type != "cuda":
            return
        every = torch.stack([finite for _, _, finite in checks]).all()
        host = torch.empty((), dtype=torch.bool, pin_memory=True)
        host.copy_(every, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self._pending_reads.append((len(checks), host, event))

    def resolve_nonfinite(self) -> None:
        """React to last step's non-finite averages, identically on every rank.

        The flags are 0-d device tensors, read with one host sync per step (at the first bucket
        of the next step), rather than one per layer in the completion callbacks: on CUDA the
        per-bucket host copies that :meth:`add_checks` queued, each waited for by its event; on
        the CPU one stack of all flags. Only when a read finds a non-finite average are the
        flags read one by one.
        """
        if self._checked_step == self.step:
            return
        self._checked_step = self.step
        pending, self._pending_checks = self._pending_checks, []
        reads, self._pending_reads = self._pending_reads, []
        if not pending:
            return
        if sum(count for count, _, _ in reads) == len(pending):
            for _, _, event in reads:
                event.synchronize()
            if all(bool(host) for _, host, _ in reads):
                return
            flags = torch.stack([finite for _, _, finite in pending])
        else:
            flags = torch.stack([finite.to(pending[0][2].device) for _, _, finite in pending])
            if bool(flags.all()):
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
        for name, assigned in assignment.items():
            slot = self.slots[name]
            # A compressor that would send this tensor whole runs as 'none' (no copy, state
            # or residual); ``plan`` then reports 'none' for it.
            compressor = effective_compressor(assigned, slot.shape)
            if slot.sparse and not is_identity(compressor):
                # wrap pins these to 'none'; an operator's override may still ask. Every rank
                # gets the same assignment, so every rank refuses alike.
                logger.warning(
                    "autocomp: %s has sparse gradients; %s refused", name, compressor.spec
                )
                continue
            if slot.compressor == compressor:
                continue
            slot.compressor = compressor
            slot.state = compressor.init_state(slot.shape, slot.seed, self.rank)
            changed.append(name)
        return changed

    def layout(self, bucket: dist.GradBucket) -> BucketLayout:
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
            offset += self.slots[name].numel  # a complex gradient: its real view's elements
        if offset != bucket.buffer().numel():
            raise RuntimeError(
                f"autocomp: bucket {bucket.index()} holds {bucket.buffer().numel()} elements but "
                f"its parameters add up to {offset}; this DDP layout is not supported"
            )
        layout = BucketLayout(key, slots, offsets)
        self._layouts[bucket.index()] = layout
        return layout

    def bucket_of(self) -> dict[str, int]:
        """DDP bucket index of every parameter seen so far (after the rebuild: the final one)."""
        return {
            slot.name: index for index, layout in self._layouts.items() for slot in layout.slots
        }

    def sends_plain(self, slot: LayerSlot, step: int | None = None) -> bool:
        """True when this layer goes into the bucket's all-reduce as it is at ``step`` (the
        bucket's step; default the hook's current one). A worker thread must pass its
        bucket's step: the training thread may already have counted the next one."""
        step = self.step if step is None else step
        return slot.residual is None and (
            is_identity(slot.compressor) or step < slot.uncompressed_until
        )
