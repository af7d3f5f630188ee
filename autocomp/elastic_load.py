"""A DCP load planner for resuming autocomp's state on another world size or FSDP mesh.

autocomp's state dict holds one entry per rank (``<key>.rank<g>.*``, see
:mod:`autocomp.checkpoint`): error-feedback residuals belong to one rank, and under FSDP to
one shard of one replica. Loaded on another topology, that entry is missing on ranks that did
not exist before, and an FSDP residual has another shape when the mesh cuts the parameter
elsewhere. ``DefaultLoadPlanner`` refuses both, and its ``allow_partial_load`` would also let
a model or optimizer key go missing without a word.

:class:`ElasticLoadPlanner` leaves exactly those per-rank autocomp tensors out of the load
(they keep the fresh controller's values) and checks everything else as strictly as
``DefaultLoadPlanner``. The controller's ``load_state_dict`` then sees the saved world size or
mesh and starts what cannot move afresh::

    dcp.load(
        {"model": model_state, "autocomp": ctl},
        checkpoint_id=path,
        planner=autocomp.ElasticLoadPlanner("autocomp"),
    )
"""

from __future__ import annotations

import dataclasses
import logging
import re

from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

__all__ = ["ElasticLoadPlanner"]

logger = logging.getLogger(__name__)


class ElasticLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that tolerates autocomp's per-rank entries changing shape or
    being absent from the checkpoint (a new world size or FSDP mesh); nothing else."""

    def __init__(self, key: str = "autocomp", **kwargs: object) -> None:
        """``key``: the top-level key the controller is stored under in the DCP state dict.
        Other keyword arguments go to ``DefaultLoadPlanner`` (``allow_partial_load`` among
        them; leave it False to keep the model's keys checked)."""
        if not key or "." in key:
            raise ValueError(f"ElasticLoadPlanner key must be a top-level name, got {key!r}")
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._entry = re.compile(rf"^{re.escape(key)}\.rank\d+\.")
        self.skipped: list[str] = []
        """The autocomp entries left out of the last load (for logs and tests)."""

    def set_up_planner(
        self,
        state_dict: dict,
        metadata: Metadata | None = None,
        is_coordinator: bool = False,
    ) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        if metadata is None or not self.flatten_state_dict:
            return
        saved = metadata.state_dict_metadata
        self.skipped = []
        for fqn in list(self.state_dict):
            if not self._entry.match(fqn):
                continue
            stored = saved.get(fqn)
            value = self.state_dict[fqn]
            size = getattr(value, "size", None)
            if stored is None or (
                isinstance(stored, TensorStorageMetadata)
                and callable(size)
                and tuple(stored.size) != tuple(size())
            ):
                del self.state_dict[fqn]
                self.skipped.append(fqn)
        if self.skipped:
            # Out of the planner's view of the checkpoint too: DefaultLoadPlanner takes a saved
            # key that the state dict lacks for a pre-2.4 checkpoint and flattens it afresh,
            # which would bring the left-out entries back.
            left_out = set(self.skipped)
            self.metadata = dataclasses.replace(
                metadata,
                state_dict_metadata={k: v for k, v in saved.items() if k not in left_out},
            )
            logger.debug("autocomp: DCP load leaves out %d per-rank entries", len(self.skipped))
