"""The controller: the user's handle on a wrapped model.

The current per-layer plan, traffic statistics, the window history, checkpointing of every
piece of compression state, and ``close()``. :mod:`autocomp.attach` creates it.
"""

from __future__ import annotations

import atexit
import logging
import secrets
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autocomp import callbacks
from autocomp.adaptive import AdaptiveLoop, WindowRecord
from autocomp.checkpoint import export_state, import_state
from autocomp.distributed import collective_device, raise_together
from autocomp.env import (
    AUTOCOMP_TOKEN,
)
from autocomp.hook_state import HookState
from autocomp.plan import Plan
from autocomp.policy.engine import PolicyDecision

logger = logging.getLogger(__name__)


class Controller:
    """Handle on a wrapped model. Create it with :func:`autocomp.wrap` or
    :func:`autocomp.make_hook`."""

    def __init__(
        self,
        model: torch.nn.Module,
        state: HookState,
        plan: Plan,
        params: dict[str, torch.nn.Parameter],
        adaptive: AdaptiveLoop | None = None,
    ) -> None:
        self.model = model
        self._state = state
        self._plan_rules = plan
        self._params = params
        self._closed = False
        self.adaptive = adaptive
        """The window loop in adaptive mode (profiler, link fit, cost model, guards, policy)."""
        self.dashboard_url: str | None = None
        """URL of the sidecar this controller started (rank 0, ``dashboard=...``)."""
        self._sidecar: subprocess.Popen[bytes] | None = None

    @property
    def run_dir(self) -> Path | None:
        """Directory of the run log (rank 0, adaptive mode), or None."""
        runlog = None if self.adaptive is None else self.adaptive.runlog
        return None if runlog is None else runlog.path.parent

    def _start_dashboard(self, run_dir: Path, port: int) -> None:
        from autocomp.service.sidecar import (
            SidecarError,
            start_sidecar_process,
            wait_until_healthy,
        )

        token = AUTOCOMP_TOKEN.get() or secrets.token_urlsafe(24)
        host = "127.0.0.1"
        url = f"http://{host}:{port}"
        try:
            self._sidecar = start_sidecar_process(run_dir, host=host, port=port, token=token)
            atexit.register(self._stop_dashboard)
            wait_until_healthy(url, timeout=30.0, process=self._sidecar)
        except (SidecarError, OSError, ImportError) as err:
            # Rank 0 alone starts it, so it must never raise: the other ranks would be left
            # waiting in the first collective.
            # The dashboard is a convenience: training goes on without it.
            logger.warning("autocomp: the dashboard did not start, training continues: %s", err)
            self._stop_dashboard()
            return
        self.dashboard_url = f"{url}/policy"
        # A console line on rank 0 only: the user asked for the dashboard and needs the URL.
        print(f"autocomp dashboard: {self.dashboard_url}  (overrides token: {token})", flush=True)

    def _stop_dashboard(self) -> None:
        if self._sidecar is not None:
            from autocomp.service.sidecar import stop_sidecar_process

            stop_sidecar_process(self._sidecar)
        self._sidecar = None

    @property
    def mode(self) -> str:
        """``"adaptive"`` (decides per window) or ``"static"`` (the plan given to wrap)."""
        return "static" if self.adaptive is None else "adaptive"

    def observe_loss(self, loss: float | torch.Tensor) -> None:
        """Feed this step's loss to the divergence guard (adaptive mode; no-op when static)."""
        if self.adaptive is not None:
            self.adaptive.observe_loss(loss)

    @property
    def history(self) -> list[WindowRecord]:
        """Window records, oldest first (rank 0 holds decisions and reasons)."""
        return [] if self.adaptive is None else list(self.adaptive.history)

    def summary(self) -> str:
        """One line on where the model stands: the latest window's summary in adaptive mode
        (the plan so far before the first window), the plan's compression in static mode."""
        history = self.history
        if history:
            return history[-1].summary()
        stats = self.stats()
        compressed = sum(1 for spec in self.plan.values() if spec != "none")
        ratio = stats["compression_ratio"]
        head = f"step {self.step:>6}: {compressed}/{len(self.plan)} layers compressed"
        if stats["bytes_sent"]:
            head += f", {ratio:,.1f}x fewer bytes than all-reduce so far"
        if self.adaptive is not None:
            head += "; no window boundary yet (the first decision comes after a few steps)"
        return head

    @property
    def last_decision(self) -> PolicyDecision | None:
        """The policy's latest decision with per-layer reasons (rank 0, adaptive mode)."""
        return None if self.adaptive is None else self.adaptive._last_decision

    # ---- inspection -----------------------------------------------------------------------

    @property
    def plan(self) -> dict[str, str]:
        """Current compressor spec of every parameter, by name (canonical spec strings)."""
        return {name: slot.compressor.spec for name, slot in self._state.slots.items()}

    @property
    def rules(self) -> Plan:
        """The plan rules ``wrap`` was given."""
        return self._plan_rules

    @property
    def step(self) -> int:
        """Optimizer steps whose gradients went through the hook."""
        return self._state.step

    def stats(self) -> dict[str, Any]:
        """Bytes this rank sent versus an uncompressed all-reduce, in total and per layer."""
        layers = {}
        sent = raw = 0
        for name, slot in self._state.slots.items():
            layers[name] = {
                "compressor": slot.compressor.spec,
                "shape": list(slot.shape),
                "wire_bytes_per_step": slot.wire_bytes(),
                "uncompressed_bytes_per_step": slot.numel * slot.dtype.itemsize,
                "bytes_sent": slot.bytes_sent,
                "bytes_uncompressed": slot.bytes_raw,
            }
            sent += slot.bytes_sent
            raw += slot.bytes_raw
        return {
            "step": self._state.step,
            "world_size": self._state.world_size,
            "bytes_sent": sent,
            "bytes_uncompressed": raw,
            "compression_ratio": raw / sent if sent else 1.0,
            "layers": layers,
        }

    # ---- checkpointing --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """All compression state of this rank, in a structure fixed from ``wrap`` on.

        Works with ``torch.save`` (one file per rank: error feedback is per rank) and with
        ``torch.distributed.checkpoint`` (rank-specific entries are namespaced by rank; the
        controller is a ``Stateful``). Format and the rules for resuming elsewhere:
        :mod:`autocomp.checkpoint`.
        """
        return export_state(self)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output; ValueError if it belongs to another job.

        A collective when any rank may refuse: call it on every rank. A rank that refuses
        makes every rank raise, so none trains on with a different plan.
        """
        problem: Exception | None = None
        try:
            import_state(self, state_dict)
        except Exception as err:  # rank-local: every rank must hear of it
            problem = err
        raise_together(problem, self._state.process_group, "autocomp's load_state_dict")

    # ---- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop compressing and free compression memory.

        DDP cannot unregister a comm hook, so after ``close()`` the hook stays in place and
        performs a plain averaging all-reduce. A collective: call it on every rank between
        the same two steps (it checks that they do: a rank that closed alone would send plain
        all-reduces against the others' compressed collectives). Idempotent.
        """
        if self._closed:
            return
        group = self._state.process_group
        if dist.is_available() and dist.is_initialized():
            steps = torch.tensor([self._state.step, -self._state.step], dtype=torch.int64)
            steps = steps.to(collective_device(group))
            dist.all_reduce(steps, op=dist.ReduceOp.MAX, group=group)
            high, low = int(steps[0]), -int(steps[1])
            if high != low:
                raise RuntimeError(
                    f"autocomp close(): ranks are at different steps ({low} to {high}); call "
                    "close() on every rank between the same two steps"
                )
        if self.adaptive is not None:
            self.adaptive.close()
        self._stop_dashboard()
        self._state.disable()
        self._closed = True
        callbacks.release_finished()  # the last steps' decodes hold the state and its group

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        compressed = sum(1 for spec in self.plan.values() if spec != "none")
        return (
            f"<autocomp.Controller step={self.step} layers={len(self.plan)} "
            f"compressed={compressed}{' closed' if self._closed else ''}>"
        )
