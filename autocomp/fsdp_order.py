"""The FSDP modules' reduce order, checked across the mesh.

:func:`autocomp.wrap_fsdp` averages each FSDP module's gradient shards across replicas from
FSDP's all-reduce hook. The replica exchanges pair up by position, so every rank must reach
the hooks in the same module order. FSDP reduces a module that took no part in a backward
from its end-of-backward callback, after all others. If a module is skipped on some replicas
only (conditional execution, a branch taken by the data), its exchange moves on those
replicas alone, and the exchanges pair different modules:

- gloo aborts when the sizes differ ("Received data size doesn't match");
- equal sizes average one module's gradient into another's, silently.

No rank can tell this alone. :class:`ModuleOrderCheck` folds every backward's order into a
hash, and every ``every`` backwards all ranks compare hashes. That takes one MAX all-reduce
of two integers over the replicate group, then one over the shard group, so it reaches every
rank of the grid. Every rank reads the same maxima, so a mismatch raises on all of them at
the same step, before the next exchange.

- Mixing is then bounded to ``every`` backwards, instead of a whole run.
- The check runs at the start of a backward, at its first hook call, before that step's
  exchanges. It reads the maxima on the host: one synchronization per check.
- An order that changes alike on every replica is fine (every module skipped everywhere), and
  it passes.
- Not caught: a module that never ran on some replica. FSDP does not reduce it there at all,
  so the replicas differ in their number of exchanges, and gloo's size error or timeout
  comes before any check. FSDP2's own HSDP aborts the same way there (``docs/fsdp.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.distributed as dist

from autocomp.distributed import collective_device

logger = logging.getLogger(__name__)

__all__ = ["ModuleOrderCheck"]

_MODULUS = (1 << 61) - 1
"""A Mersenne prime: the hash stays below 2**61, so it and its negation fit in an int64."""
_BASE = 1_000_003
_END_OF_BACKWARD = 0
"""Folded in after each backward (module indices fold in as index + 1)."""


class ModuleOrderCheck:
    """The order the FSDP hooks ran in on this rank, and the periodic check across the mesh
    (module docstring)."""

    def __init__(
        self, module_names: Sequence[str], groups: Sequence[dist.ProcessGroup], every: int
    ) -> None:
        if every < 0:
            raise ValueError(f"order_check_every must be >= 0, got {every}")
        self.module_names = list(module_names)
        self.groups = list(groups)
        self.every = every
        self._order: list[int] = []
        self._hash = 0
        self._last_order: list[int] | None = None
        self.checks = 0
        """Checks run (each one collective per mesh dimension)."""

    def record(self, index: int) -> None:
        """A module's hook ran (``index``: its position in the wrap's layout)."""
        self._order.append(index)

    def abandon(self) -> None:
        """The backward did not finish (it raised): its partial order says nothing."""
        self._order = []

    def end_backward(self) -> None:
        """Fold this backward's order into the hash."""
        order, self._order = self._order, []
        if not order:
            return
        h = self._hash
        for index in order:
            h = (h * _BASE + index + 1) % _MODULUS
        self._hash = (h * _BASE + _END_OF_BACKWARD) % _MODULUS
        if self._last_order is not None and order != self._last_order:
            logger.debug(
                "autocomp.wrap_fsdp: this backward reduced the FSDP modules in the order %s",
                [self.module_names[i] for i in order],
            )
        self._last_order = order

    def due(self, step: int) -> bool:
        """Whether the backward starting at ``step`` (completed backwards, the same on every
        rank) runs the check."""
        return self.every > 0 and step > 0 and step % self.every == 0

    def check(self, step: int) -> None:
        """Collective over the mesh: RuntimeError on every rank unless every rank reduced the
        same modules in the same order since the last check."""
        local, self._hash = self._hash, 0
        if not self.groups:
            return
        values = torch.tensor([local, -local], dtype=torch.int64)
        values = values.to(collective_device(self.groups[0]))
        for group in self.groups:
            dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
        highest, negated_lowest = (int(v) for v in values.cpu().tolist())
        self.checks += 1
        if highest != -negated_lowest:
            raise RuntimeError(
                f"autocomp.wrap_fsdp: before step {step}, the ranks reduced the FSDP modules "
                f"in different orders in the last {self.every} backwards. The replica "
                "exchanges pair modules by position, so they averaged different modules' "
                "gradients together. A module that runs on some replicas and not on others "
                "(a data-dependent branch) does this: run every FSDP module on every rank "
                "(for example, multiply an unused branch's output by 0). This rank's last "
                f"order: {[self.module_names[i] for i in (self._last_order or [])]}."
            )
