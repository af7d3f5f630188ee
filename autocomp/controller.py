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

from autocomp.adaptive import AdaptiveLoop, WindowRecord
from autocomp.compressors import build_compressor
from autocomp.env import (
    AUTOCOMP_TOKEN,
)
from autocomp.hook import HookState
from autocomp.plan import Plan
from autocomp.policy.engine import PolicyDecision

logger = logging.getLogger(__name__)

STATE_DICT_VERSION = 2


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
        self._sidecar = start_sidecar_process(run_dir, host=host, port=port, token=token)
        atexit.register(self._stop_dashboard)
        url = f"http://{host}:{port}"
        try:
            wait_until_healthy(url, timeout=30.0, process=self._sidecar)
        except SidecarError as err:
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
        """All compression state of this rank (error feedback, warm starts, generators).

        Error-feedback residuals differ between ranks: save one file per rank, like optimizer
        state under ZeRO, and load each rank's own file for a bit-identical resume.
        """
        layers = {}
        for name, slot in self._state.slots.items():
            layers[name] = {
                "compressor": slot.compressor.spec,
                "residual": None if slot.residual is None else slot.residual.detach().clone(),
                "state": _export_state(slot.state),
            }
        return {
            "version": STATE_DICT_VERSION,
            "mode": self.mode,
            "rank": self._state.rank,
            "world_size": self._state.world_size,
            "step": self._state.step,
            "layers": layers,
            "adaptive": None if self.adaptive is None else self.adaptive.state_dict(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output; raise ValueError if it belongs to another job."""
        if not isinstance(state_dict, Mapping) or "layers" not in state_dict:
            raise ValueError("not an autocomp state dict (missing 'layers')")
        version = state_dict.get("version")
        if version != STATE_DICT_VERSION:
            raise ValueError(
                f"autocomp state dict version {version!r}; expected {STATE_DICT_VERSION} "
                "(version 1 held PowerSGD's alternating phase and the old window loop)"
            )
        for key, mine in (("world_size", self._state.world_size), ("rank", self._state.rank)):
            if state_dict.get(key) != mine:
                raise ValueError(
                    f"state dict was saved with {key}={state_dict.get(key)}, this process has "
                    f"{key}={mine}; error-feedback residuals are per rank and scaled by the world "
                    "size, so each rank must load its own file from a job of the same size"
                )
        saved = state_dict["layers"]
        mine_names = set(self._state.slots)
        if set(saved) != mine_names:
            missing = sorted(mine_names - set(saved))[:5]
            extra = sorted(set(saved) - mine_names)[:5]
            raise ValueError(
                f"state dict does not match this model: missing {missing}, unexpected {extra}"
            )
        if state_dict.get("mode", "static") != self.mode:
            raise ValueError(
                f"state dict is from a {state_dict.get('mode')} controller, this one is {self.mode}"
            )
        if self.adaptive is not None:
            # The plan is part of the adaptive state: switch to the saved one first.
            self._state.assign(
                {name: build_compressor(entry["compressor"]) for name, entry in saved.items()}
            )
            self.adaptive.load_state_dict(state_dict["adaptive"])
        for name, entry in saved.items():
            spec = build_compressor(entry["compressor"]).spec
            if spec != self._state.slots[name].compressor.spec:
                raise ValueError(
                    f"{name}: state dict was saved with compressor {spec}, this job uses "
                    f"{self._state.slots[name].compressor.spec}; wrap with the same plan to resume"
                )
        for name, entry in saved.items():
            slot = self._state.slots[name]
            device = self._params[name].device
            residual = entry["residual"]
            slot.residual = None if residual is None else residual.detach().to(device).clone()
            slot.state = slot.compressor.init_state(slot.shape, slot.seed, self._state.rank)
            slot.state.update(_import_state(entry["state"]))
        self._state.step = int(state_dict["step"])

    # ---- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Stop compressing and free compression memory.

        DDP cannot unregister a comm hook, so after ``close()`` the hook stays in place and
        performs a plain averaging all-reduce. Idempotent. Call it on every rank at the same
        step boundary, as with any change to what ranks send.
        """
        if self._closed:
            return
        if self.adaptive is not None:
            self.adaptive.close()
        self._stop_dashboard()
        self._state.enabled = False
        for slot in self._state.slots.values():
            slot.residual = None
            slot.state = {}
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        compressed = sum(1 for spec in self.plan.values() if spec != "none")
        return (
            f"<autocomp.Controller step={self.step} layers={len(self.plan)} "
            f"compressed={compressed}{' closed' if self._closed else ''}>"
        )


def _export_state(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith("_"):
            continue  # transient, recomputed within a step
        if isinstance(value, torch.Generator):
            out[key] = {"generator_state": value.get_state()}
        elif isinstance(value, torch.Tensor):
            out[key] = value.detach().clone()
        else:
            out[key] = value
    return out


def _import_state(saved: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in saved.items():
        if isinstance(value, Mapping) and "generator_state" in value:
            generator = torch.Generator()
            generator.set_state(value["generator_state"])
            out[key] = generator
        elif isinstance(value, torch.Tensor):
            out[key] = value.clone()
        else:
            out[key] = value
    return out
