"""Response and request models of the sidecar's JSON API.

They are the contract between the sidecar, its dashboard and anything that scrapes the API, so
every field says what it means and in which unit. Values that the run log may not have yet
(no link fit before the first window, no prediction before the first decision) are ``None``
rather than a made-up zero.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

OverrideKind = Literal["pin", "unpin", "force_none", "unforce", "freeze", "unfreeze"]
"""What an operator can ask the controller to do at the next window boundary."""


class RunMeta(BaseModel):
    """What the run is: fixed when the controller opened the run log."""

    model_config = ConfigDict(extra="allow")

    run_id: str | None = Field(None, description="Unique id of the run.")
    created: float | None = Field(None, description="When the run log was created, unix s.")
    world_size: int | None = Field(None, description="Number of DDP ranks.")
    policy: str | None = Field(None, description="Name of the policy preset in use.")
    target_overlap: float | None = Field(
        None, description="Fraction of gradient communication the policy tries to hide."
    )
    window: int | None = Field(None, description="Steps between decisions.")


class WindowSummary(BaseModel):
    """One decision window as measured on the ranks (medians over the window's steps)."""

    step: int = Field(description="Step at which the window's decision takes effect.")
    time: float | None = Field(None, description="Unix time the window was recorded.")
    bandwidth_bytes_per_s: float | None = Field(
        None, description="Live link bandwidth fit, bytes/s (None before the first fit)."
    )
    latency_s: float | None = Field(None, description="Live per-hop latency fit, seconds.")
    node_link_bytes_per_s: float | None = Field(
        None,
        description="Hierarchical reduce: intra-node link, bus bytes/s (the bandwidth fit is "
        "then the cross-node link); None for a flat reduce.",
    )
    nic_bytes_per_s: float | None = Field(
        None, description="Bytes/s sent on the interface torch.distributed uses."
    )
    step_seconds: float | None = Field(None, description="Median training step time.")
    backward_seconds: float | None = Field(None, description="Median backward compute time.")
    hideable_seconds: float | None = Field(
        None, description="Backward compute after the first bucket is ready."
    )
    comm_busy_seconds: float | None = Field(None, description="Collective service time.")
    compress_seconds: float | None = Field(None, description="Compression + decompression.")
    exposed_seconds: float | None = Field(
        None, description="Communication left after the backward ended."
    )
    measured_overlap: float | None = Field(
        None, description="1 - exposed / (comm + compression), 0..1."
    )
    predicted_overlap: float | None = Field(
        None, description="What the previous decision predicted for this window."
    )
    bytes_per_step: float | None = Field(None, description="Wire bytes per step on one rank.")
    uncompressed_bytes_per_step: float | None = Field(
        None, description="Bytes per step plain all-reduce would have sent."
    )
    compression_ratio: float | None = Field(
        None, description="uncompressed_bytes_per_step / bytes_per_step."
    )
    loss: float | None = Field(None, description="Mean loss over the window.")


class LayerPlan(BaseModel):
    """One layer of the current plan, with why the policy chose it."""

    name: str = Field(description="Qualified parameter name.")
    shape: list[int] = Field(default_factory=list, description="Gradient shape.")
    numel: int | None = Field(None, description="Number of elements.")
    dtype: str | None = Field(None, description="Gradient dtype.")
    compressor: str | None = Field(None, description="Compressor spec in use.")
    uncompressed_bytes: int | None = Field(None, description="Bytes of the raw gradient.")
    wire_bytes: int | None = Field(
        None, description="Bytes this layer puts on the wire per step and rank (predicted)."
    )
    ratio: float | None = Field(None, description="uncompressed_bytes / wire_bytes.")
    reason: str | None = Field(None, description="Why the policy chose this compressor.")
    rule: str | None = Field(None, description="Which policy rule decided.")
    predicted_seconds: float | None = Field(
        None, description="Predicted communication + compression seconds per step."
    )
    runner_up: str | None = Field(None, description="Second-best compressor spec, if any.")


class PolicyResponse(BaseModel):
    """``GET /api/policy``: the current plan, the run and the latest window."""

    run: RunMeta
    step: int | None = Field(None, description="Step of the latest decision (None: none yet).")
    window: WindowSummary | None = Field(None, description="The latest window, if any.")
    layers: list[LayerPlan] = Field(description="Every layer, in the run log's order.")


class Change(BaseModel):
    """One layer switching compressor at a window boundary."""

    step: int
    name: str = Field(description="Qualified parameter name.")
    old_spec: str | None = Field(None, description="Compressor before the switch.")
    new_spec: str | None = Field(None, description="Compressor after the switch.")
    reason: str | None = Field(None, description="The policy's reason for the new choice.")


class Decision(BaseModel):
    """The policy's choice for one layer at one step (``autocomp.policy.engine.LayerDecision``).

    Unknown columns a newer run log may add are passed through.
    """

    model_config = ConfigDict(extra="allow")

    step: int = Field(description="Step the decision was made at.")
    idx: int | None = Field(None, description="Position of the layer in the model's order.")
    name: str = Field(description="Qualified parameter name.")
    spec: str | None = Field(None, description="Chosen compressor spec.")
    reason: str | None = Field(None, description="Why, in words (rule or optimizer numbers).")
    rule: str | None = Field(
        None, description="Deciding rule: warmup, pin, too_small, knapsack, ..."
    )
    predicted_seconds: float | None = Field(
        None, description="Predicted seconds on the critical path per step."
    )
    predicted_wire_bytes: int | None = Field(None, description="Predicted wire bytes per step.")
    predicted_error: float | None = Field(None, description="Predicted squared error.")
    runner_up: str | None = Field(None, description="Second-best spec, if the optimizer chose.")
    runner_up_seconds: float | None = Field(None, description="The runner-up's seconds.")
    runner_up_error: float | None = Field(None, description="The runner-up's squared error.")


class DecisionsResponse(BaseModel):
    """``GET /api/decisions?since=STEP``: what changed after ``since``, and the latest reasons."""

    since: int | None = Field(None, description="The ``since`` asked for (None: from the start).")
    latest_step: int | None = Field(None, description="Step of the latest decision.")
    changes: list[Change] = Field(description="Compressor switches after ``since``, oldest first.")
    decisions: list[Decision] = Field(description="Per-layer decisions at ``latest_step``.")


class GuardEventModel(BaseModel):
    """One convergence-guard event (see ``autocomp.guards``)."""

    id: int | None = None
    step: int = Field(description="Step the observation that fired belongs to.")
    guard: str = Field(description="Which guard fired, e.g. ``loss_divergence``.")
    layer: str | None = Field(None, description="Layer, or None for the whole model.")
    detail: str | None = Field(None, description="The numbers behind the decision.")
    action: str | None = Field(None, description="What the controller did.")


class GuardsResponse(BaseModel):
    """``GET /api/guards``: counts per guard over the whole run plus the latest events."""

    counts: dict[str, int] = Field(description="Events per guard name, whole run.")
    events: list[GuardEventModel] = Field(description="Latest events, oldest first.")


class SeriesResponse(BaseModel):
    """``GET /api/bandwidth``: parallel arrays, one entry per window, oldest first."""

    step: list[int] = Field(default_factory=list, description="Window steps.")
    time: list[float | None] = Field(default_factory=list, description="Unix seconds.")
    bandwidth: list[float | None] = Field(
        default_factory=list, description="Live link bandwidth fit, bytes/s."
    )
    latency_s: list[float | None] = Field(default_factory=list, description="Per-hop latency.")
    step_seconds: list[float | None] = Field(default_factory=list, description="Median step.")
    measured_overlap: list[float | None] = Field(default_factory=list, description="0..1.")
    predicted_overlap: list[float | None] = Field(
        default_factory=list, description="What the previous decision predicted, 0..1."
    )
    compression_ratio: list[float | None] = Field(
        default_factory=list, description="Uncompressed / wire bytes per step."
    )
    bytes_per_step: list[float | None] = Field(
        default_factory=list, description="Wire bytes per step and rank."
    )
    loss: list[float | None] = Field(default_factory=list, description="Mean window loss.")
    target_overlap: float | None = Field(None, description="The run's overlap target.")


class OverrideRequest(BaseModel):
    """``POST /api/overrides``: one operator instruction, applied at the next window boundary.

    ``pin`` needs ``glob`` and ``spec``; ``unpin`` needs ``glob``; ``force_none`` /
    ``unforce`` (every layer uncompressed, or back to the policy) and ``freeze`` /
    ``unfreeze`` (keep the current plan, or decide again) take neither.
    """

    model_config = ConfigDict(extra="forbid")

    kind: OverrideKind
    glob: str | None = Field(
        None, max_length=500, description="fnmatch glob over qualified parameter names."
    )
    spec: str | None = Field(None, max_length=200, description="Compressor spec for ``pin``.")
    who: str = Field("api", min_length=1, max_length=100, description="Who asked, for the log.")


class Override(BaseModel):
    """One stored override and whether the controller has applied it."""

    model_config = ConfigDict(extra="allow")

    id: int
    created: float | None = Field(None, description="When it was requested, unix seconds.")
    who: str | None = None
    kind: str
    glob: str | None = None
    spec: str | None = None
    applied_step: int | None = Field(None, description="Step it took effect (None: pending).")
    applied_time: float | None = Field(None, description="When the controller recorded it.")
    status: str | None = Field(
        None, description="``pending``, ``applied``, or the controller's reason for rejecting it."
    )


class OverridesResponse(BaseModel):
    """``GET /api/overrides``: newest first."""

    overrides: list[Override]


class Health(BaseModel):
    """``GET /healthz``: the sidecar is up; ``run_readable`` says whether the run log is."""

    status: Literal["ok"] = "ok"
    run_readable: bool
    run_dir: str
    detail: str | None = Field(None, description="Why the run log is not readable.")
    latest_step: int | None = None
