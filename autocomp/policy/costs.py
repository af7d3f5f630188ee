"""What one compressor costs one layer: its collective's time and its compression work.

A layer's option costs its collective's bandwidth term, ``comm_seconds(collective, bytes) -
comm_seconds(collective, 0)``, plus a share of one extra latency when it needs a collective a
bucket would not issue anyway (an all-gather, a payload in another dtype, or PowerSGD's
final round): the hook batches those per bucket, so the latency is split among the
bucket's optimizer-placed layers (:func:`latency_shares`), plus its compression work (cost
model), kept apart because it runs on the backward's thread. The share is exact when every
layer of the bucket takes the same kind and short when one takes it alone, so an option also
names the collective it adds (``OptionCost.own_collective``) and the exact model charges each
bucket's such collectives one full latency (``autocomp.policy.plan_load.GroupLoad``): on the
digits CNN at 50 Mbit/s, fp16 on the one small matrix of a bucket otherwise on PowerSGD was
charged half a latency and measured 3-4% of the step (docs/benchmarks-history.md, "a lone
collective"). Every bucket pays one all-reduce
latency whatever the plan; the engine (:mod:`autocomp.policy.engine`) counts that itself.
PowerSGD's first round travels in that one (with the previous bucket's final round and the
bucket's small plain parts, :func:`autocomp.hook.launch_bucket`), so only its final round
is charged a latency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from autocomp.compressors import Collective, Compressor
from autocomp.policy.types import CostModelProtocol, LayerProfile

__all__ = ["LatencyCache", "OptionCost", "latency_shares", "option_cost"]


def latency_shares(layers: Sequence[LayerProfile], buckets: int) -> dict[str, float]:
    """Per layer, how many layers the optimizer places may share its extra collectives: those
    of its DDP bucket, or without bucket indices the layers over the estimated bucket count.

    The hook issues one collective per bucket for each kind a plan needs there, so a latency
    charged to every layer counted PowerSGD's two rounds once per layer: on the GPT LM at
    10 Mbit/s that made all-rank-4 look about 8% slower than a top-k mix it measured 5%
    faster than. Split evenly, a uniform bucket is charged exactly; a mixed one is charged
    less than the extra collectives it really adds (at most one latency per kind). For a
    payload dtype of its own and the all-gather, the search's exact model adds the rest
    (``OptionCost.own_collective``); for PowerSGD's final round, the ledger of measured plans
    (``policy/payoff.py``) is what catches a mix that measures slow.
    """
    by_bucket: dict[int, int] = {}
    for layer in layers:
        if layer.bucket is not None:
            by_bucket[layer.bucket] = by_bucket.get(layer.bucket, 0) + 1
    unplaced = sum(1 for layer in layers if layer.bucket is None)
    spread = max(1.0, unplaced / max(1, buckets))
    return {
        layer.name: float(by_bucket[layer.bucket]) if layer.bucket is not None else spread
        for layer in layers
    }


class LatencyCache:
    """Per-decision view of the cost model: its latency (zero-byte time) by collective,
    cached, and its communication and compression-time answers."""

    def __init__(self, cost_model: CostModelProtocol, world_size: int) -> None:
        self.cost_model = cost_model
        self.world_size = world_size
        self._latency: dict[Collective, float] = {}

    def comm(self, collective: Collective, payload_bytes: int) -> float:
        return float(self.cost_model.comm_seconds(collective, payload_bytes, self.world_size))

    def half_sum(self, dtype: torch.dtype, payload_bytes: int) -> float:
        """What summing ``payload_bytes`` of ``dtype`` costs beyond its bytes (the cost model's
        measured half-precision sum)."""
        per_element = self.cost_model.half_sum_seconds_per_element(dtype)
        return float(per_element) * (payload_bytes // dtype.itemsize)

    def of(self, collective: Collective) -> float:
        if collective not in self._latency:
            self._latency[collective] = max(0.0, self.comm(collective, 0))
        return self._latency[collective]


@dataclass(frozen=True, slots=True)
class OptionCost:
    """One option's predicted cost on one layer."""

    comm: float
    work: float
    wire: int
    first_round: float = 0.0
    second_round: float = 0.0
    final_work: float = 0.0
    """Of ``work``: the final round's payload, computed after the first round is summed."""
    decode: float = 0.0
    """Of ``work``: the decode after the last collective."""
    own_collective: str = ""
    """The collective this option adds to its bucket ('' when it rides the bucket's own)."""
    own_latency: float = 0.0
    """That collective's full latency."""
    own_charged: float = 0.0
    """Of ``comm``: the share of ``own_latency`` charged to this layer."""

    @property
    def seconds(self) -> float:
        return self.comm + self.work


def option_cost(
    compressor: Compressor,
    layer: LayerProfile,
    latency: LatencyCache,
    share: float = 1.0,
) -> OptionCost:
    """Communication and compression work of one layer with one compressor.

    ``share``: the layers that may split the latency of a collective the bucket would not
    issue anyway (the hook sends every two-round layer of a bucket in one collective per
    round, every gathered payload in one all-gather and each payload dtype in one
    all-reduce); 1 charges each layer the full latency.
    """
    if layer.sparse_bytes is not None:
        # Sent as DDP sends it, alone in its bucket: gloo's sparse all-reduce gathers every
        # rank's rows and indices (a collective of its own, latency included).
        sent = layer.sparse_bytes
        return OptionCost(latency.comm(Collective.ALL_GATHER, sent), 0.0, sent)
    wire = compressor.wire_bytes(layer.shape, layer.dtype)
    collective = compressor.collective
    base = latency.of(collective)
    extra = base / max(1.0, share)
    work = latency.cost_model.compress_seconds(compressor, layer.shape, layer.nonzero_share)
    work = max(0.0, float(work))
    final_share, decode_share = compressor.work_shares(layer.shape)
    final_work, decode = work * final_share, work * decode_share
    sizes = compressor.round_wire_bytes(layer.shape, layer.dtype)
    if len(sizes) > 1:
        # The first round is what the next bucket's hook call waits for (in the bucket's own
        # all-reduce), the final round is launched by it (a collective more).
        first = max(0.0, latency.comm(collective, sizes[0]) - base)
        second = math.fsum(
            max(0.0, latency.comm(collective, size) - base) + extra for size in sizes[1:]
        )
        return OptionCost(first + second, work, wire, first, second, final_work, decode)
    comm = max(0.0, latency.comm(collective, sizes[0]) - base)
    payload_dtype = compressor.payload_dtype(layer.dtype)
    if collective is Collective.ALL_REDUCE:
        comm += latency.half_sum(payload_dtype, sizes[0])
    shares_bucket = collective is Collective.ALL_REDUCE and payload_dtype == layer.dtype
    if shares_bucket:
        return OptionCost(comm, work, wire, final_work=final_work, decode=decode)
    return OptionCost(
        comm + extra,
        work,
        wire,
        final_work=final_work,
        decode=decode,
        # One all-gather per bucket carries every gathered payload; one all-reduce per dtype.
        own_collective=(
            collective.value
            if collective is Collective.ALL_GATHER
            else f"{collective.value}:{payload_dtype}"
        ),
        own_latency=base,
        own_charged=extra,
    )
