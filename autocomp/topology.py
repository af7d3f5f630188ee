"""Which ranks share a node, and the process groups of a two-level (node, cross-node) reduce.

A slow link is almost always the one between nodes; ranks inside a node share NVLink, PCIe or
(here) loopback. The hierarchical hook (:mod:`autocomp.hook_hierarchy`) reduces at full
precision inside each node and compresses only what crosses between nodes, so it needs to know
the nodes and to hold three kinds of groups:

* ``intra``: the ranks of this rank's node (the reduce-scatter inside the node);
* ``intra_gather``: the same ranks again, for the gather that hands the result back. A second
  group, because the hierarchical hook issues that stage from its exchange thread while
  reduce-scatters come from the same thread in a fixed order; two groups keep each group's
  collective sequence a pure function of the bucket order whatever the stage interleaving;
* ``cross``: the ranks with this rank's local index on every node, which own the same shard.

Nodes come from torchrun's environment: ``GROUP_RANK`` (the agent's node rank), else
``NODE_RANK``, else the host name. Ranks exchange a digest of that key once, so every rank
derives the same table; ``LOCAL_WORLD_SIZE``, when set, is checked against it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from autocomp.distributed import collective_device, gather_digests

__all__ = [
    "HierarchyGroups",
    "Topology",
    "build_hierarchy_groups",
    "detect_topology",
    "release_hierarchy_groups",
]

logger = logging.getLogger(__name__)

HierarchySetting = Literal["auto"] | bool


def node_key() -> str:
    """This process's node, as torchrun describes it (or the host name without torchrun)."""
    for variable in ("GROUP_RANK", "NODE_RANK"):
        value = os.environ.get(variable, "").strip()
        if value:
            return f"{variable}={value}"
    return f"host={socket.gethostname()}"


@dataclass(frozen=True, slots=True)
class Topology:
    """The node of every rank of a process group (group ranks; nodes in order of first rank)."""

    rank: int
    """This rank in the group."""
    node_of: tuple[int, ...]
    """Node index of every group rank."""

    @property
    def world_size(self) -> int:
        return len(self.node_of)

    @property
    def num_nodes(self) -> int:
        return max(self.node_of) + 1

    @property
    def node(self) -> int:
        return self.node_of[self.rank]

    def node_ranks(self, node: int) -> list[int]:
        """Group ranks on ``node``, ascending (their position is their local index)."""
        return [r for r, n in enumerate(self.node_of) if n == node]

    @property
    def local_rank(self) -> int:
        return self.node_ranks(self.node).index(self.rank)

    @property
    def local_world_size(self) -> int:
        return len(self.node_ranks(self.node))

    @property
    def uniform(self) -> bool:
        """Every node holds the same number of ranks (needed to pair shards across nodes)."""
        sizes = {len(self.node_ranks(n)) for n in range(self.num_nodes)}
        return len(sizes) == 1

    def shard_ranks(self, local_rank: int) -> list[int]:
        """Group ranks with local index ``local_rank``, one per node, in node order."""
        return [self.node_ranks(n)[local_rank] for n in range(self.num_nodes)]

    def worth_it(self) -> bool:
        """Hierarchy can help: more than one node, and more than one rank per node."""
        return self.num_nodes > 1 and self.uniform and self.local_world_size > 1

    def describe(self) -> str:
        return f"{self.num_nodes} nodes x {self.local_world_size} ranks"


def detect_topology(group: dist.ProcessGroup | None = None) -> tuple[Topology, str | None]:
    """Collective over ``group``: every rank's node, from the environment (one all-gather).

    Also returns why the table cannot be trusted, or None: ``LOCAL_WORLD_SIZE`` disagreeing
    with the ranks that report the same node (ranks in separate network namespaces of one
    host without ``GROUP_RANK``, or a launcher misconfiguration). Every rank gets a reason
    when any rank found one (one more all-reduce), so every rank decides alike.
    """
    key = node_key()
    digests = gather_digests(hashlib.sha256(key.encode()).digest(), group)
    first_rank: dict[bytes, int] = {}
    for digest in digests:
        first_rank.setdefault(digest, len(first_rank))
    topology = Topology(rank=dist.get_rank(group), node_of=tuple(first_rank[d] for d in digests))
    declared = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    problem = None
    if declared.isdigit() and int(declared) != topology.local_world_size:
        problem = (
            f"LOCAL_WORLD_SIZE={declared} but {topology.local_world_size} ranks of this group "
            f"report this node ({key}); set GROUP_RANK or NODE_RANK per node, as torchrun does"
        )
    flag = torch.tensor([0 if problem is None else 1], dtype=torch.int64)
    flag = flag.to(collective_device(group))
    dist.all_reduce(flag, group=group)
    if problem is None and int(flag.item()):
        problem = "the node table is inconsistent on another rank; see that rank's log"
    return topology, problem


def resolve_hierarchy(
    setting: HierarchySetting, topology: Topology, group: dist.ProcessGroup | None
) -> bool:
    """Whether to reduce hierarchically; raises ValueError when ``True`` cannot be honoured.

    The answer depends only on the topology, which every rank derived from the same gathered
    table, so every rank reaches the same answer (or the same error).
    """
    is_world = group is None or group == dist.group.WORLD
    if setting == "auto":
        return topology.worth_it() and is_world
    if not setting:
        return False
    if not is_world:
        raise ValueError(
            "hierarchy=True needs DDP on the default process group (the node and cross-node "
            "groups are created by every rank of the job)"
        )
    if topology.num_nodes < 2 or topology.local_world_size < 2:
        raise ValueError(
            f"hierarchy=True needs more than one node with more than one rank each; this job "
            f"has {topology.describe()} (set GROUP_RANK/NODE_RANK and LOCAL_WORLD_SIZE per "
            "node, as torchrun does, or use hierarchy='auto')"
        )
    if not topology.uniform:
        sizes = [len(topology.node_ranks(n)) for n in range(topology.num_nodes)]
        raise ValueError(
            f"hierarchy=True needs the same number of ranks on every node; got {sizes}"
        )
    return True


@dataclass(frozen=True, slots=True)
class HierarchyGroups:
    """This rank's process groups of the two-level reduce (see the module docstring)."""

    topology: Topology
    intra: dist.ProcessGroup
    intra_gather: dist.ProcessGroup
    cross: dist.ProcessGroup


def build_hierarchy_groups(topology: Topology) -> HierarchyGroups:
    """Collective over the default group: create every node and shard group, in one order.

    ``new_group`` must be called by every rank of the job for every group, members or not, in
    the same order; the order here is a pure function of the topology.
    """
    mine: dict[str, dist.ProcessGroup] = {}
    global_rank = [dist.get_global_rank(dist.group.WORLD, r) for r in range(topology.world_size)]
    for node in range(topology.num_nodes):
        ranks = [global_rank[r] for r in topology.node_ranks(node)]
        for role in ("intra", "intra_gather"):
            group = dist.new_group(ranks=ranks)
            if node == topology.node:
                mine[role] = group
    for local in range(topology.local_world_size):
        ranks = [global_rank[r] for r in topology.shard_ranks(local)]
        group = dist.new_group(ranks=ranks)
        if local == topology.local_rank:
            mine["cross"] = group
    if topology.rank == 0:
        logger.info("autocomp: hierarchical reduce over %s", topology.describe())
    return HierarchyGroups(topology, mine["intra"], mine["intra_gather"], mine["cross"])


def release_hierarchy_groups(groups: HierarchyGroups) -> None:
    """Destroy this rank's groups of a two-level reduce that will not run (every rank calls it
    for its own groups, so no group is left half torn down); each gloo group holds threads."""
    for group in (groups.intra, groups.intra_gather, groups.cross):
        dist.destroy_process_group(group)
