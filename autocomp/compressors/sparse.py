"""Sparsifiers: ``topk`` (largest magnitudes, sent as values + indices) and ``randomk``.

``randomk`` draws its indices from a seed shared by all ranks, so every rank selects the same
coordinates: only the values travel, and they can be summed by all-reduce. ``topk`` selects
different coordinates on each rank, so its payload is gathered.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from autocomp.compressors.base import Collective, Compressor, Param, register_compressor
from autocomp.compressors.packing import from_bytes, to_bytes

_RATIO = Param("ratio", float, 0.01, low=0.0, high=1.0, low_open=True, doc="fraction kept")


def kept(numel: int, ratio: float) -> int:
    """Number of elements a sparsifier keeps: at least one, at most all."""
    return min(numel, max(1, round(ratio * numel))) if numel else 0


def _index_dtype(numel: int) -> torch.dtype:
    return torch.int32 if numel < 2**31 else torch.int64


SPARSE_SELECT_MIN_NUMEL = 1 << 16
"""Below this many elements ``torch.topk`` is cheap and the sparse selection's extra pass
is not worth it."""
SPARSE_SELECT_MAX_SHARE = 0.25
"""The sparse selection runs when at most this share of the elements is nonzero: the index
list ``nonzero`` builds (8 bytes an entry) stays small beside the tensor."""


def selects_among_nonzeros(numel: int, nonzero: float, device_type: str) -> bool:
    """Whether :func:`largest_indices` selects among the nonzeros of a tensor of ``numel``
    elements with ``nonzero`` of them nonzero on a ``device_type`` device (the cost model
    prices top-k's selection by the same test)."""
    return (
        device_type == "cpu"
        and numel >= SPARSE_SELECT_MIN_NUMEL
        and nonzero <= SPARSE_SELECT_MAX_SHARE * numel
    )


def largest_indices(flat: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of ``k`` largest-magnitude entries of ``flat``, each index once.

    On the CPU, ``torch.topk`` over a large tensor is slow whatever its content (170 ms on
    the hashed n-gram table's 8.4M elements, one core), and an embedding table's gradient is
    mostly zeros (0.6% nonzero there). When few entries are nonzero, the selection runs over
    those alone (count, list, select: 33 ms there); with no more nonzeros than ``k``, all of
    them are kept and the rest of the ``k`` are zero entries, which add nothing. On CUDA
    ``nonzero`` would wait for the device, and ``topk`` is fast there: it is used as is.
    """
    numel = flat.numel()
    if not selects_among_nonzeros(numel, 0, flat.device.type):
        return torch.topk(flat.abs(), k, sorted=False).indices
    nonzero = int(torch.count_nonzero(flat))
    if not selects_among_nonzeros(numel, nonzero, flat.device.type):
        return torch.topk(flat.abs(), k, sorted=False).indices
    chosen = flat.nonzero().squeeze(1)
    if nonzero >= k:
        return chosen[torch.topk(flat[chosen].abs(), k, sorted=False).indices]
    # The first k + nonzero indices (all of them, when fewer) hold k - nonzero zero entries.
    head = torch.arange(min(numel, k + nonzero), device=flat.device)
    padding = head[flat[head] == 0][: k - nonzero]
    return torch.cat([chosen, padding])


@register_compressor
class TopK(Compressor):
    """Keep the ``ratio`` fraction of largest-magnitude entries (Aji & Heafield 2017; Lin 2018)."""

    name: ClassVar[str] = "topk"
    decode_share: ClassVar[float] = 0.07
    collective: ClassVar[Collective] = Collective.ALL_GATHER
    params: ClassVar[tuple[Param, ...]] = (
        _RATIO,
        Param("ef", bool, True, doc="feed unsent coordinates back into the next step"),
    )

    def wire_bytes(
        self, shape: torch.Size, dtype: torch.dtype, state: dict[str, Any] | None = None
    ) -> int:
        numel = shape.numel()
        k = kept(numel, float(self.config["ratio"]))
        return k * (4 + _index_dtype(numel).itemsize)

    def compress(self, x: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        flat = x.reshape(-1)
        k = kept(flat.numel(), float(self.config["ratio"]))
        indices = largest_indices(flat, k)
        return to_bytes(flat[indices].to(torch.float32), indices.to(_index_dtype(flat.numel())))

    def _split(self, payload: torch.Tensor, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = kept(numel, float(self.config["ratio"]))
        values, indices = from_bytes(payload, [(torch.float32, k), (_index_dtype(numel), k)])
        return values, indices.to(torch.int64)

    def decompress(
        self, payload: torch.Tensor, shape: torch.Size, state: dict[str, Any]
    ) -> torch.Tensor:
        return self.decompress_sum([payload], shape, state)

    def decompress_sum(
        self, payloads: list[torch.Tensor], shape: torch.Size, state: dict[str, Any]
    ) -> torch.Tensor:
        out = torch.zeros(shape.numel(), dtype=torch.float32, device=payloads[0].device)
        # One rank at a time: indices are unique within a rank, so even atomic scatter-adds
        # (CUDA) see no collisions and every rank computes bit-identical sums.
        for payload in payloads:
            values, indices = self._split(payload, shape.numel())
            out.index_add_(0, indices, values)
        return out.reshape(shape)


@register_compressor
class RandomK(Compressor):
    """Keep ``ratio`` of the coordinates, chosen by a seed every rank shares.

    With ``unbiased=true`` (default) the kept values are scaled by numel/k and indices are drawn
    with replacement, so the estimate is unbiased (variance grows as 1/ratio) and needs no
    error feedback. With ``unbiased=false`` the values are sent unscaled and the unsent
    coordinates are fed back by error feedback.
    """

    name: ClassVar[str] = "randomk"
    decode_share: ClassVar[float] = 0.75
    collective: ClassVar[Collective] = Collective.ALL_REDUCE
    params: ClassVar[tuple[Param, ...]] = (
        _RATIO,
        Param("unbiased", bool, True, doc="scale by numel/k instead of error feedback"),
    )

    @property
    def biased(self) -> bool:
        return not self.config["unbiased"]

    @property
    def error_feedback(self) -> bool:
        return self.biased

    def wire_bytes(
        self, shape: torch.Size, dtype: torch.dtype, state: dict[str, Any] | None = None
    ) -> int:
        return kept(shape.numel(), float(self.config["ratio"])) * 4

    def init_state(self, shape: torch.Size, seed: int, rank: int) -> dict[str, Any]:
        return {"seed": seed, "calls": 0}

    def _indices(self, numel: int, state: dict[str, Any], device: torch.device) -> torch.Tensor:
        cached = state.get("_indices")
        if cached is not None and cached[0] == state["calls"]:
            return cached[1]
        # Drawn on the payload's device: same seed and call count on every rank, so every
        # rank picks the same indices without communicating (and without a host transfer).
        generator = state.get("_generator")
        if generator is None or generator.device.type != device.type:
            generator = state["_generator"] = torch.Generator(device=device)
        generator.manual_seed((state["seed"] * 1_000_003 + state["calls"]) % (1 << 63))
        k = kept(numel, float(self.config["ratio"]))
        if k == 0:
            indices = torch.zeros(0, dtype=torch.int64, device=device)
        else:
            indices = torch.randint(0, numel, (k,), generator=generator, device=device)
        state["_indices"] = (state["calls"], indices)
        return indices

    def compress(self, x: torch.Tensor, state: dict[str, Any]) -> torch.Tensor:
        flat = x.reshape(-1)
        values = flat[self._indices(flat.numel(), state, flat.device)]
        if self.config["unbiased"] and values.numel():
            values = values * (flat.numel() / values.numel())
        return values.to(torch.float32)

    def decompress(
        self, payload: torch.Tensor, shape: torch.Size, state: dict[str, Any]
    ) -> torch.Tensor:
        numel = shape.numel()
        indices = self._indices(numel, state, payload.device)
        out = torch.zeros(numel, dtype=torch.float32, device=payload.device)
        if self.config["unbiased"]:
            # Duplicate draws each carry an independent share of the estimate: add them, in a
            # fixed order. On CUDA ``index_add_`` adds duplicates with atomics in whatever order
            # the threads run, so two ranks decoding the same all-reduced payload could round
            # apart (H200: 200 different results in 200 decodes of 32768 draws);
            # ``index_put_(accumulate=True)`` sorts the indices stably and sums each run in
            # position order. The CPU's ``index_add_`` is sequential, gives the same bits and
            # is 1.4x faster there (1M coordinates, 262k draws: 0.95 vs 1.49 ms).
            values = payload.to(torch.float32)
            if out.device.type == "cpu":
                out.index_add_(0, indices, values)
            else:
                out.index_put_((indices,), values, accumulate=True)
        else:
            # Duplicates carry the same value: write it once.
            out[indices] = payload.to(torch.float32)
        return out.reshape(shape)

    def commit(self, payload: torch.Tensor | list[torch.Tensor], state: dict[str, Any]) -> None:
        state["calls"] += 1
        state.pop("_indices", None)
