"""Whether the two-level reduce pays: time the link inside a node against the one between nodes.

The hierarchical hook stages every bucket inside the node at full precision (a reduce-scatter,
later a gather) so that only one shard per rank crosses the slow link, compressed. That is the
right plan when the node's own link is far faster than the network: GPUs on NVLink behind
Ethernet, or ranks that share a host's memory. It is the wrong one where the node's link is no
faster: PCIe-only GPUs whose traffic goes through the host next to a fast fabric, VMs that share
one virtual NIC, "nodes" whose ranks talk TCP through the same switch. There the two staging
passes cost about as much as the transfer they save, and nothing inside the node is
compressed; the flat reduce, which compresses every rank's traffic, is the better plan.

The topology cannot tell these apart, so ``hierarchy="auto"`` measures before the first step,
on the groups the hierarchy would use: every rank times an all-reduce of a zero buffer inside
its node, then one across the nodes with every local rank's shard group at once (the L groups
of a node share its link, as the hook's shard owners do). Each level's buffer grows by 4x from
64 KB until its slowest flow takes 20 ms or the buffer reaches the gradients' size, so a slow
link is read at a small size and a fast one past its latency. Each size is timed three times
after a priming pass and each rank keeps its fastest, since one scheduling hiccup can read a
loopback link 10x slow; every round agrees through two small all-reduces, so all ranks grow
and stop together and hold the same figures.

``AUTOCOMP_NODE_LINK_MIN_ADVANTAGE`` (4 by default; 0 skips the measurement) is the ratio of
node to cross-node bandwidth below which the job stays flat. The adaptive loop warns at the
same ratio when the link inside a node measures slow later in the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from autocomp.compressors import Collective
from autocomp.distributed import collective_device, raise_together
from autocomp.env import AUTOCOMP_NODE_LINK_MIN_ADVANTAGE
from autocomp.link_model import link_bytes
from autocomp.probe_runner import (
    OPENING_PROBE_MAX_BYTES,
    OPENING_PROBE_SECONDS,
    OPENING_PROBE_START_BYTES,
    ProbeRunner,
)
from autocomp.topology import HierarchyGroups

__all__ = ["LevelRates", "agreed_min_advantage", "measure_levels"]

LEVEL_PROBE_TIMED_PASSES = 3
"""Timed all-reduces per size and level; each rank keeps its fastest. One pass in three read a
loopback node link at 65 MB/s against 640-760 in the others (4 ranks on 2 cores, 614 KB)."""


@dataclass(frozen=True, slots=True)
class LevelRates:
    """The two links of a two-level reduce, as every rank agreed them (bus bytes per second)."""

    node_bytes_per_s: float
    """What one rank moves per second in an all-reduce inside its node (the slowest node's)."""
    cross_bytes_per_s: float
    """What a node moves per second across the nodes: its L shard flows together, summed (the
    slowest node's), comparable with the adaptive loop's cross-node link meter."""
    node_payload_bytes: int
    """The inside-node probe's final size per rank."""
    cross_payload_bytes: int
    """The cross-node probe's final size per rank."""

    @property
    def advantage(self) -> float:
        """How many times faster the link inside a node is than the one between nodes."""
        if self.cross_bytes_per_s <= 0:
            return math.inf
        return self.node_bytes_per_s / self.cross_bytes_per_s

    def pays(self, min_advantage: float) -> bool:
        """The two-level reduce is worth its staging passes at this threshold."""
        return self.advantage >= min_advantage

    def describe(self) -> str:
        return (
            f"inside a node {self.node_bytes_per_s * 8 / 1e9:.2f} Gbit/s, between nodes "
            f"{self.cross_bytes_per_s * 8 / 1e9:.3f} Gbit/s ({self.advantage:.1f}x)"
        )


def agreed_min_advantage(group: dist.ProcessGroup | None) -> float:
    """Collective: ``AUTOCOMP_NODE_LINK_MIN_ADVANTAGE``, checked, and the same on every rank.

    A launcher sets the environment per process, so one rank may hold another value or a typo;
    each rank parses its own, and any problem is raised on every rank before the ranks could
    branch apart (one measuring, another not).
    """
    problem: Exception | None = None
    value = 0.0
    try:
        value = float(AUTOCOMP_NODE_LINK_MIN_ADVANTAGE.get())
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(
                f"{AUTOCOMP_NODE_LINK_MIN_ADVANTAGE.name}={value}: expected a finite number >= 0"
            )
    except ValueError as err:
        problem = err
    raise_together(problem, group, AUTOCOMP_NODE_LINK_MIN_ADVANTAGE.name)
    both = torch.tensor([value, -value], dtype=torch.float64).to(collective_device(group))
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    highest, lowest = float(both[0]), -float(both[1])
    if highest != lowest:
        raise ValueError(
            f"{AUTOCOMP_NODE_LINK_MIN_ADVANTAGE.name} differs between ranks ({lowest} to "
            f"{highest}); set the same value on every rank"
        )
    return value


def _grow(
    runner: ProbeRunner,
    level: dist.ProcessGroup,
    everyone: dist.ProcessGroup | None,
    cap_bytes: int,
    device: torch.device,
) -> tuple[int, float]:
    """(payload, seconds) of one level's probe, the same on every rank of ``everyone``.

    A flow's time is its group's MIN (the rank that arrived last did not wait, so it is free
    of skew); the level's is its slowest flow (MAX over ``everyone``). The sizes are the
    opening probe's (:meth:`ProbeRunner.opening`), whose agreement also carries the forward
    time and stops early on a plainly fast link, neither of which a level needs."""
    cap = max(OPENING_PROBE_START_BYTES, min(cap_bytes, OPENING_PROBE_MAX_BYTES))
    size = OPENING_PROBE_START_BYTES
    while True:
        fastest = runner.fastest_all_reduce(size, device, level, LEVEL_PROBE_TIMED_PASSES)
        seconds = torch.tensor([fastest], dtype=torch.float64)
        seconds = seconds.to(device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MIN, group=level)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=everyone)
        flow = float(seconds.item())
        if flow >= OPENING_PROBE_SECONDS or size >= cap:
            return size, flow
        size = min(cap, size * 4)


def measure_levels(
    groups: HierarchyGroups, raw_bytes: int, group: dist.ProcessGroup | None = None
) -> LevelRates:
    """Collective over ``group`` (the job's, which ``groups`` partition): both links' rates.

    ``raw_bytes``: the gradients' size per rank, the largest probe worth sending.
    """
    device = collective_device(group)
    runner = ProbeRunner()
    topology = groups.topology
    node_size, node_seconds = _grow(runner, groups.intra, group, raw_bytes, device)
    cross_size, cross_seconds = _grow(runner, groups.cross, group, raw_bytes, device)
    node_rate = link_bytes(Collective.ALL_REDUCE, node_size, topology.local_world_size)
    cross_flow = link_bytes(Collective.ALL_REDUCE, cross_size, topology.num_nodes)
    return LevelRates(
        node_bytes_per_s=node_rate / max(node_seconds, 1e-12),
        cross_bytes_per_s=cross_flow * topology.local_world_size / max(cross_seconds, 1e-12),
        node_payload_bytes=node_size,
        cross_payload_bytes=cross_size,
    )
