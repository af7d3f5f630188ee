"""What one adaptive window measured (combined over ranks) and what it decided.

:class:`WindowMeasurement` is everything rank 0's planner needs to decide, with no tensors and
no process group: the adaptive loop builds it from the boundary's collectives, and tests
replay recorded sequences of it (``to_dict`` / ``from_dict`` are JSON-safe).
:class:`WindowRecord` is what the window measured and decided, for ``ctl.history``, the run
log and the dashboard.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from autocomp.compressors import Collective
from autocomp.env import AUTOCOMP_RECORD_WINDOWS
from autocomp.error_sketch import SKETCH_WIDTH, averaged_error

if TYPE_CHECKING:
    from autocomp.profiler import WindowProfile

logger = logging.getLogger(__name__)

__all__ = [
    "LayerWindow",
    "PlanUpdate",
    "WindowMeasurement",
    "WindowRecord",
    "WindowVector",
    "record_window_line",
]

TIMING_FIELDS = (
    "step_seconds",
    "backward_seconds",
    "hideable_seconds",
    "comm_busy_seconds",
    "compress_seconds",
    "exposed_seconds",
    "compute_seconds",
)
"""Per-step medians (the compute-only step: the minimum) each rank reports; the measurement
holds their mean over ranks."""


@dataclass(slots=True)
class LayerWindow:
    """One layer over one window, combined over ranks."""

    spec: str
    """The compressor that ran (canonical spec)."""
    grad_norm: float | None
    """RMS over ranks and sampled steps of the gradient norm (None: not sampled)."""
    residual_norm: float | None
    """The same for the error-feedback residual."""
    rel_error: float | None
    """Mean measured relative error of ``spec`` (None: not sampled or uncompressed)."""
    hook_seconds: float
    """Mean hook work per step for this layer, over ranks (0 when uncompressed)."""
    bucket: int | None
    """DDP bucket index (None: not seen yet)."""
    bucket_hideable_seconds: float | None
    """Backward compute left once the layer's bucket was ready, mean over ranks."""
    nonzero: float | None = None
    """Mean over ranks of the gradient's nonzero share (None: not sampled, or a recording
    from before it was measured)."""
    grad_l1: float | None = None
    """Mean over ranks and sampled steps of the gradient's L1 norm (None: not sampled, or a
    recording from before it was measured)."""
    avg_error: float | None = None
    """Relative error of the averaged update under ``spec``, estimated from the ranks' summed
    sketches over the window's sampled steps (:mod:`autocomp.error_sketch`). None: not
    sketched (uncompressed), a rank without samples or ranks that sampled different steps,
    or a recording from before it was measured. ``rel_error`` is each rank's residual against
    its own input, which also counts the rank's deviation from the mean."""


@dataclass(slots=True)
class WindowMeasurement:
    """Everything one window boundary hands to the planner (see the module docstring)."""

    step: int
    """Step at which the next plan takes effect."""
    world_size: int
    window_steps: int
    """Steps the window covered."""
    profiled_ranks: int
    """Ranks whose profiler had at least one complete step this window."""
    timings: dict[str, float]
    """Means over ranks of the per-step medians, keys :data:`TIMING_FIELDS`."""
    loss: float | None
    """Mean loss over the window and ranks (``ctl.observe_loss``), or None."""
    layers: dict[str, LayerWindow]
    """Per layer, in the model's parameter order."""
    busy_min: list[float]
    """Per step, the link's busy time, minimum over ranks (skew-free)."""
    collectives: list[list[tuple[Collective, int, float]]]
    """Rank 0's own collectives per step: (kind, payload bytes, service seconds)."""
    probe: tuple[int, float] | None = None
    """Active link probe run at this boundary: (payload bytes, seconds, min over ranks)."""
    nonfinite: list[str] = field(default_factory=list)
    """Layers whose decoded average was NaN/Inf since the last boundary (already reset)."""
    bytes_per_step: float = 0.0
    """Wire bytes rank 0 sent per step under the plan that ran."""
    uncompressed_bytes_per_step: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (collective kinds as their values)."""
        return {
            "step": self.step,
            "world_size": self.world_size,
            "window_steps": self.window_steps,
            "profiled_ranks": self.profiled_ranks,
            "timings": dict(self.timings),
            "loss": self.loss,
            "layers": {
                name: {s: getattr(layer, s) for s in LayerWindow.__slots__}
                for name, layer in self.layers.items()
            },
            "busy_min": list(self.busy_min),
            "collectives": [
                [[kind.value, size, seconds] for kind, size, seconds in step]
                for step in self.collectives
            ],
            "probe": None if self.probe is None else list(self.probe),
            "nonfinite": list(self.nonfinite),
            "bytes_per_step": self.bytes_per_step,
            "uncompressed_bytes_per_step": self.uncompressed_bytes_per_step,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WindowMeasurement:
        probe = data.get("probe")
        return cls(
            step=int(data["step"]),
            world_size=int(data["world_size"]),
            window_steps=int(data["window_steps"]),
            profiled_ranks=int(data["profiled_ranks"]),
            timings={k: float(v) for k, v in data["timings"].items()},
            loss=None if data["loss"] is None else float(data["loss"]),
            layers={name: LayerWindow(**layer) for name, layer in data["layers"].items()},
            busy_min=[float(v) for v in data["busy_min"]],
            collectives=[
                [(Collective(kind), int(size), float(seconds)) for kind, size, seconds in step]
                for step in data["collectives"]
            ],
            probe=None if probe is None else (int(probe[0]), float(probe[1])),
            nonfinite=[str(name) for name in data.get("nonfinite", [])],
            bytes_per_step=float(data.get("bytes_per_step", 0.0)),
            uncompressed_bytes_per_step=float(data.get("uncompressed_bytes_per_step", 0.0)),
        )


@dataclass(slots=True)
class WindowRecord:
    """What one window measured and decided (rank 0 has the full record)."""

    step: int
    """Step at which the new plan takes effect."""
    bandwidth_bytes_per_s: float | None
    """Live link bandwidth fit (None before the first fit)."""
    latency_s: float | None
    """Live per-hop latency fit."""
    nic_bytes_per_s: float | None
    """Cross-check: bytes/s sent on the interface torch.distributed uses (psutil)."""
    step_seconds: float
    backward_seconds: float
    hideable_seconds: float
    comm_busy_seconds: float
    compress_seconds: float
    exposed_seconds: float
    measured_overlap: float
    """1 - exposed / (comm + compression), :func:`autocomp.exposure.overlap`."""
    predicted_overlap: float | None
    """What the previous decision predicted for this window."""
    bytes_per_step: float
    """Wire bytes this rank sent per step under the previous plan."""
    uncompressed_bytes_per_step: float
    loss: float | None
    """Mean loss over the window (from ``observe_loss``), all ranks."""
    changes: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Layer -> (old spec, new spec) switched at this boundary."""
    decision: dict[str, Any] | None = None
    """The policy decision (per-layer reasons), rank 0 only."""
    guard_events: list[dict[str, Any]] = field(default_factory=list)
    probe_bytes: int = 0
    """Payload of the active link probe run at this boundary (0: none), per rank."""
    probe_seconds: float | None = None
    """Its timed pass, minimum over ranks."""
    probe_bytes_per_s: float | None = None
    """Link bytes per second the probe achieved (latency included: a lower bound)."""
    predicted_step_seconds: float | None = None
    """What the previous decision predicted for this window's step."""
    compute_seconds: float = 0.0
    """The window's compute-only step (minimum over its steps, mean over ranks)."""
    node_link_bytes_per_s: float | None = None
    """Hierarchical reduce only: the intra-node link's bus bytes/s (rank 0's reduce-scatters
    and gathers, median); ``bandwidth_bytes_per_s`` is then the cross-node link."""

    @classmethod
    def opening(cls, uncompressed_bytes_per_step: float, **fields: Any) -> WindowRecord:
        """The record of the opening (step 0): nothing measured yet but the link probe."""
        return cls(
            step=0,
            bandwidth_bytes_per_s=fields.pop("bandwidth_bytes_per_s", None),
            latency_s=fields.pop("latency_s", None),
            nic_bytes_per_s=None,
            step_seconds=0.0,
            backward_seconds=0.0,
            hideable_seconds=0.0,
            comm_busy_seconds=0.0,
            compress_seconds=0.0,
            exposed_seconds=0.0,
            measured_overlap=1.0,
            predicted_overlap=None,
            bytes_per_step=0.0,
            uncompressed_bytes_per_step=uncompressed_bytes_per_step,
            loss=None,
            **fields,
        )

    def summary(self) -> str:
        """One log line: bandwidth seen, bytes per step, what changed and why."""
        bw = (
            "link n/a"
            if self.bandwidth_bytes_per_s is None
            else f"link {self.bandwidth_bytes_per_s * 8 / 1e6:,.0f} Mbit/s"
        )
        if self.step_seconds <= 0 and self.bytes_per_step <= 0:
            # The opening: before step 0's first collective, only the link probe ran.
            head = f"step {self.step:>6}: {bw}, no step measured yet"
        else:
            ratio = self.uncompressed_bytes_per_step / max(self.bytes_per_step, 1.0)
            head = (
                f"step {self.step:>6}: {bw}, {self.bytes_per_step / 1e6:,.2f} MB/step "
                f"({ratio:,.1f}x), step {self.step_seconds * 1e3:,.0f} ms, "
                f"overlap {self.measured_overlap:.2f}"
            )
        if self.node_link_bytes_per_s is not None:
            head += f", node link {self.node_link_bytes_per_s * 8 / 1e9:,.1f} Gbit/s"
        if self.probe_bytes and self.probe_seconds is not None:
            rate = self.probe_bytes_per_s or 0.0
            head += (
                f", probe {self.probe_bytes / 1e3:,.0f} kB in {self.probe_seconds * 1e3:,.1f} ms"
                f" ({rate * 8 / 1e6:,.0f} Mbit/s)"
            )
        if not self.changes:
            return head + "; plan unchanged"
        reasons = {}
        if self.decision is not None:
            reasons = {d["name"]: d["reason"] for d in self.decision["layers"]}
        parts = [
            f"{name} {old} -> {new}" + (f" ({reasons[name]})" if name in reasons else "")
            for name, (old, new) in sorted(self.changes.items())
        ]
        return head + "; " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class WindowVector:
    """The fixed layout of the boundary's summing all-reduce: the same on every rank.

    A header (has a profile, the timing fields, bytes sent and their uncompressed size this
    window, loss sum, loss count), then per layer: grad norm^2, residual norm^2, has sample,
    rel error, hook seconds, hideable seconds after the layer's bucket is ready, the
    non-finite count (with a hierarchy only a layer's owners see it; summed, every rank's
    count reaches rank 0's guards), the gradient's nonzero share, its L1 norm, and whether
    that was measured.

    After the layers, one block per sketched layer (``sketched``: the compressed layers, the
    same list on every rank): whether this rank sketched it, then per sampled step (at most
    ``sketch_steps``, the last ones) the step number plus 1 and its square (summed, they show
    whether every rank sketched that same step) and the sketches of what the compressor lost
    and of its input (:mod:`autocomp.error_sketch`).
    """

    PER_LAYER = 10
    HEADER = 1 + len(TIMING_FIELDS) + 4
    PER_SKETCH_STEP = 2 + 2 * SKETCH_WIDTH

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def pack(
        self,
        profile: WindowProfile | None,
        loss_sum: float | torch.Tensor,
        loss_count: int,
        nonfinite: set[str],
        bucket_of: Mapping[str, int],
        sent_bytes: float = 0.0,
        raw_bytes: float = 0.0,
        sketched: Sequence[str] = (),
        sketch_steps: int = 0,
    ) -> torch.Tensor:
        """This rank's window as a vector (``sent_bytes``/``raw_bytes``: what its hook sent
        this window, and their uncompressed size; ``sketched``, ``sketch_steps``: see the class
        docstring)."""
        header, per = self.HEADER, self.PER_LAYER
        layers_end = header + per * len(self.names)
        block = 1 + self.PER_SKETCH_STEP * sketch_steps
        values = [0.0] * (layers_end + block * len(sketched))
        values[header - 4] = float(sent_bytes)
        values[header - 3] = float(raw_bytes)
        values[header - 2] = float(loss_sum)  # the window's one read of a device loss
        values[header - 1] = float(loss_count)
        for i, name in enumerate(self.names):
            if name in nonfinite:
                values[header + per * i + 6] = 1.0
        if profile is not None:
            values[0] = 1.0
            for i, field_name in enumerate(TIMING_FIELDS):
                values[1 + i] = getattr(profile.times, field_name)
            bucket_hideable = profile.times.bucket_hideable_seconds
            for i, name in enumerate(self.names):
                base = header + per * i
                sample = profile.layer_samples.get(name)
                if sample is not None:
                    values[base] = sample.grad_norm**2
                    values[base + 1] = sample.residual_norm**2
                    values[base + 2] = 1.0
                    values[base + 3] = sample.rel_error or 0.0
                    values[base + 7] = sample.nonzero
                    if sample.grad_l1 is not None:
                        values[base + 8] = sample.grad_l1
                        values[base + 9] = 1.0
                values[base + 4] = profile.layer_seconds.get(name, 0.0)
                bucket = bucket_of.get(name)  # a bucket unseen this window: the whole H
                values[base + 5] = bucket_hideable.get(
                    bucket if bucket is not None else -1, profile.times.hideable_seconds
                )
            for j, name in enumerate(sketched):
                sample = profile.layer_samples.get(name)
                if sample is None or not sample.sketches or sketch_steps <= 0:
                    continue
                base = layers_end + block * j
                values[base] = 1.0
                for k, (step, sketch) in enumerate(sample.sketches[-sketch_steps:]):
                    at = base + 1 + self.PER_SKETCH_STEP * k
                    values[at : at + 2] = [step + 1.0, (step + 1.0) ** 2]
                    values[at + 2 : at + self.PER_SKETCH_STEP] = sketch
        return torch.tensor(values, dtype=torch.float64)

    def nonfinite(self, combined: torch.Tensor) -> list[str]:
        """The layers any rank saw a non-finite average of."""
        header, per = self.HEADER, self.PER_LAYER
        return [
            name for i, name in enumerate(self.names) if float(combined[header + per * i + 6]) > 0
        ]

    def means(self, combined: torch.Tensor) -> tuple[dict[str, float], float | None]:
        """Timing fields averaged over the profiled ranks, and the mean loss (None: none)."""
        ranks = max(1.0, float(combined[0]))
        timings = {name: float(combined[1 + i]) / ranks for i, name in enumerate(TIMING_FIELDS)}
        count = float(combined[self.HEADER - 1])
        loss = float(combined[self.HEADER - 2]) / count if count > 0 else None
        return timings, loss

    def bytes_per_step(
        self, combined: torch.Tensor, steps: int, link_world: int
    ) -> tuple[float, float]:
        """(sent, uncompressed) bytes per step per instance of the policy's link: every rank's
        bytes summed, over ``link_world`` senders. Flat, that is a rank's own traffic. With a
        hierarchy (``link_world``: the nodes) it is a node's, which its owners split between
        them, so rank 0's own count read 1/L of it."""
        scale = 1.0 / (max(1, steps) * max(1, link_world))
        return (
            float(combined[self.HEADER - 4]) * scale,
            float(combined[self.HEADER - 3]) * scale,
        )

    def layers(
        self,
        combined: torch.Tensor,
        specs: Mapping[str, str],
        bucket_of: Mapping[str, int],
        world: int,
        sketched: Sequence[str] = (),
        sketch_steps: int = 0,
    ) -> dict[str, LayerWindow]:
        """Per layer, the combined window (hook costs summed over the layer's owners;
        ``sketched``, ``sketch_steps`` as packed, where every one of the ``world`` ranks must
        have sketched the same steps)."""
        ranks = max(1.0, float(combined[0]))
        out = {}
        for i, name in enumerate(self.names):
            base = self.HEADER + self.PER_LAYER * i
            samples = float(combined[base + 2])
            sampled = samples > 0
            bucket = bucket_of.get(name)
            out[name] = LayerWindow(
                spec=specs[name],
                grad_norm=math.sqrt(float(combined[base]) / samples) if sampled else None,
                residual_norm=math.sqrt(float(combined[base + 1]) / samples) if sampled else None,
                rel_error=float(combined[base + 3]) / samples if sampled else None,
                nonzero=float(combined[base + 7]) / samples if sampled else None,
                grad_l1=(
                    float(combined[base + 8]) / float(combined[base + 9])
                    if float(combined[base + 9]) > 0
                    else None
                ),
                hook_seconds=float(combined[base + 4]) / world,
                bucket=bucket,
                bucket_hideable_seconds=(
                    float(combined[base + 5]) / ranks if bucket is not None else None
                ),
            )
        layers_end = self.HEADER + self.PER_LAYER * len(self.names)
        block = 1 + self.PER_SKETCH_STEP * sketch_steps
        for j, name in enumerate(sketched):
            base = layers_end + block * j
            out[name].avg_error = self._averaged_error(
                combined[base : base + block].tolist(), sketch_steps, world
            )
        return out

    def _averaged_error(self, block: list[float], steps: int, world: int) -> float | None:
        """One layer's sketch block, summed over ranks: the error of the averaged update, or
        None unless every rank sketched the same steps. A rank that lost its samples (no
        complete step) would leave its residual out of the sums: no estimate then, rather
        than a wrong one."""
        if round(block[0]) != world:
            return None
        lost = total = 0.0
        used = 0
        for k in range(steps):
            at = 1 + self.PER_SKETCH_STEP * k
            step_sum, square_sum = block[at], block[at + 1]
            if step_sum == 0:
                continue
            if abs(step_sum**2 - world * square_sum) > 0.5:  # the ranks' steps differ
                return None
            lost += math.fsum(v * v for v in block[at + 2 : at + 2 + SKETCH_WIDTH])
            total += math.fsum(
                v * v for v in block[at + 2 + SKETCH_WIDTH : at + self.PER_SKETCH_STEP]
            )
            used += 1
        if not used:
            return None
        return averaged_error(lost, total)


def record_window_line(line: dict[str, Any]) -> None:
    """Append one JSON line to ``AUTOCOMP_RECORD_WINDOWS``, when set (rank 0): the opening's
    probe, or a window's measurement with the plan that ran and the decision it led to, so a
    run can be replayed through :class:`~autocomp.planner.WindowPlanner` offline."""
    path = AUTOCOMP_RECORD_WINDOWS.get()
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
    except OSError as err:  # a debugging aid must never stop training
        logger.warning("autocomp: cannot record window to %s: %s", path, err)


@dataclass(frozen=True, slots=True)
class PlanUpdate:
    """What rank 0 broadcasts after a window, and the window's record."""

    plan: list[str]
    """One canonical spec per layer, in the planner's layer order."""
    resets: list[str]
    """Layers whose error feedback and compressor state every rank resets."""
    probe_bytes: int
    """Payload of the link probe the next boundary runs (0: none)."""
    record: WindowRecord
    probe_pass_seconds: float = 0.0
    """What one pass of that probe takes at the link estimate it was sized on (0: unknown):
    a priming pass far slower ends the probe early (``link_probe.PROBE_OVERRUN_FACTOR``)."""
    window_steps: int = 0
    """Steps until the next boundary when the next window only measures (an uncompressed
    baseline, ``PayoffCheck.baseline_window_steps``); 0: the regular schedule."""
    start_plan: list[str] | None = None
    """The opening only: the plan step 0 runs before ``plan`` takes over at step 1 (the
    warm-up's plan, ``opening.warmup_start``); None: ``plan`` runs from step 0."""
