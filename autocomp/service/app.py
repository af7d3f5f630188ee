"""The sidecar's web app: dashboard, JSON API, Prometheus metrics and operator overrides.

It only reads the run log the controller (rank 0) writes, and writes overrides through the
run log's own short transactions, so it can run, crash or be killed without touching training.
Each request opens the run log afresh: the trainer may create, rotate or finish it at any time,
and a broken or missing run log must produce a clear message (HTTP 503) rather than a stale
cached view or a 500 with a traceback.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hmac
import html
import importlib.resources
import json
import logging
import math
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from autocomp.compressors import build_compressor
from autocomp.guards import GUARD_NAMES
from autocomp.runlog import RunLogError, RunReader
from autocomp.service.schemas import (
    Change,
    Decision,
    DecisionsResponse,
    GuardEventModel,
    GuardsResponse,
    Health,
    LayerPlan,
    Override,
    OverrideRequest,
    OverridesResponse,
    PolicyResponse,
    RunMeta,
    SeriesResponse,
    WindowSummary,
)

logger = logging.getLogger(__name__)

__all__ = ["RunUnavailable", "create_app"]

RETRY_AFTER_SECONDS = 5
"""What a 503 tells clients (and the error page's auto-refresh) to wait before retrying."""

MAX_CHANGE_STEPS_WITH_REASONS = 50
"""Reasons for ``/api/decisions`` changes are looked up per step; cap the lookups per call."""

_DTYPE_BYTES = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
}

_SECURITY_HEADERS = {
    # The dashboard is self-contained: nothing may load from anywhere else.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


_BEARER = HTTPBearer(auto_error=False)
"""Reads ``Authorization: Bearer ...`` without rejecting by itself (we answer 401, not 403)."""


class Reader(Protocol):
    """What the app needs from ``autocomp.runlog.RunReader`` (also lets tests substitute one)."""

    def meta(self) -> dict[str, Any]: ...
    def latest_window(self) -> dict[str, Any] | None: ...
    def windows(self, since_step: int | None = None, limit: int = 1000) -> list[dict]: ...
    def decisions(self, step: int | None = None) -> list[dict[str, Any]]: ...
    def changes(self, since_step: int | None = None) -> list[dict[str, Any]]: ...
    def guard_events(self, since_step: int | None = None, limit: int = 1000) -> list[dict]: ...
    def guard_counts(self) -> dict[str, int]: ...
    def series(self, limit: int = 2000) -> dict[str, list]: ...
    def overrides(self, limit: int = 100) -> list[dict[str, Any]]: ...
    def add_override(
        self, kind: str, *, glob: str | None = None, spec: str | None = None, who: str
    ) -> int: ...
    def snapshot(self) -> contextlib.AbstractContextManager[Any]: ...
    def close(self) -> None: ...


ReaderFactory = Callable[[Path], Reader]


class RunUnavailable(Exception):
    """The run log cannot be read right now; the message says why, for a human."""


def _dtype_bytes(dtype: Any) -> int | None:
    if dtype is None:
        return None
    return _DTYPE_BYTES.get(str(dtype).removeprefix("torch.").lower())


def _finite(value: Any) -> float | None:
    """JSON has no NaN/Inf: they become None (unknown) rather than an invalid document."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _ratio(uncompressed: Any, wire: Any) -> float | None:
    raw, sent = _finite(uncompressed), _finite(wire)
    if raw is None or sent is None or sent <= 0:
        return None
    return raw / sent


def window_summary(window: Mapping[str, Any] | None) -> WindowSummary | None:
    """The flat columns of a run-log window row, with the compression ratio worked out."""
    if window is None:
        return None
    fields = {
        name: _finite(window.get(name))
        for name in WindowSummary.model_fields
        if name not in ("step", "compression_ratio")
    }
    fields["compression_ratio"] = _ratio(
        window.get("uncompressed_bytes_per_step"), window.get("bytes_per_step")
    )
    return WindowSummary(step=int(window["step"]), **fields)


def layer_plans(meta: Mapping[str, Any], decisions: Iterable[Mapping[str, Any]]) -> list[LayerPlan]:
    """Join the run's layer list with the latest decision per layer, in the run's order."""
    by_name = {d["name"]: d for d in decisions}
    rows: list[LayerPlan] = []
    seen: set[str] = set()
    for layer in meta.get("layers") or []:
        name = str(layer["name"])
        seen.add(name)
        rows.append(_layer_plan(name, layer, by_name.get(name, {})))
    # Decisions for layers the metadata does not list still deserve a row.
    rows.extend(_layer_plan(n, {}, d) for n, d in by_name.items() if n not in seen)
    return rows


def _layer_plan(name: str, layer: Mapping[str, Any], decision: Mapping[str, Any]) -> LayerPlan:
    shape = [int(s) for s in layer.get("shape") or []]
    numel = layer.get("numel")
    if numel is None and shape:
        numel = math.prod(shape)
    size = _dtype_bytes(layer.get("dtype"))
    uncompressed = None if numel is None or size is None else int(numel) * size
    predicted = _finite(decision.get("predicted_wire_bytes"))
    wire = None if predicted is None else round(predicted)
    return LayerPlan(
        name=name,
        shape=shape,
        numel=None if numel is None else int(numel),
        dtype=None if layer.get("dtype") is None else str(layer["dtype"]),
        compressor=decision.get("spec"),
        uncompressed_bytes=uncompressed,
        wire_bytes=wire,
        ratio=_ratio(uncompressed, wire),
        reason=decision.get("reason"),
        rule=decision.get("rule"),
        predicted_seconds=_finite(decision.get("predicted_seconds")),
        runner_up=decision.get("runner_up"),
    )


def validate_override(request: OverrideRequest, layer_names: list[str]) -> dict[str, str | None]:
    """Check an override before it reaches the controller; raise ValueError saying what is wrong.

    The controller applies overrides asynchronously at a window boundary, where nobody can be
    told about a mistake any more, so everything checkable is checked here: the glob is present
    when the kind needs one and matches a layer, the spec builds (canonicalized, so the log
    shows exactly what will run), and no field is given that the kind would silently ignore.
    """
    kind = request.kind
    glob = request.glob.strip() if request.glob is not None else None
    spec = request.spec.strip() if request.spec is not None else None
    if glob == "":
        glob = None
    if spec == "":
        spec = None
    takes_glob = kind in ("pin", "unpin")
    if takes_glob and glob is None:
        raise ValueError(f"override {kind!r} needs a 'glob' over parameter names, e.g. '*.bias'")
    if glob is not None and not takes_glob:
        raise ValueError(f"override {kind!r} applies to every layer and takes no 'glob'")
    if kind == "pin":
        if spec is None:
            raise ValueError("override 'pin' needs a 'spec', e.g. 'powersgd:rank=4'")
        spec = build_compressor(spec).spec
    elif spec is not None:
        raise ValueError(f"only 'pin' takes a 'spec'; override {kind!r} does not")
    matched = any(fnmatch.fnmatchcase(name, glob) for name in layer_names) if glob else True
    if kind == "pin" and layer_names and not matched:
        shown = ", ".join(layer_names[:8]) + (", ..." if len(layer_names) > 8 else "")
        raise ValueError(f"glob {glob!r} matches no layer of this run (layers: {shown})")
    return {"glob": glob, "spec": spec}


class _RunCollector(Collector):
    """Reads the run log on every scrape, so /metrics is never staler than the log itself."""

    def __init__(self, open_run: Callable[[], contextlib.AbstractContextManager[Reader]]):
        self._open_run = open_run

    def describe(self) -> list:
        # Registering must not touch the run log (it may not exist yet).
        return []

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("autocomp_run_up", "1 when the sidecar can read the run log.")
        try:
            with self._open_run() as reader:
                families = list(self._families(reader))
        except RunUnavailable as exc:
            logger.info("metrics: run log unavailable: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families

    def _families(self, reader: Reader) -> Iterator[Any]:
        meta = reader.meta()
        info = InfoMetricFamily("autocomp_run", "The run the sidecar serves.")
        info.add_metric(
            [],
            {
                "run_id": str(meta.get("run_id") or ""),
                "policy": str(meta.get("policy") or ""),
                "world_size": str(meta.get("world_size") or ""),
            },
        )
        yield info
        target = _finite(meta.get("target_overlap"))
        if target is not None:
            yield _gauge("autocomp_target_overlap", "Overlap target of the policy.", target)

        window = reader.latest_window()
        summary = window_summary(window)
        if summary is not None:
            for name, doc, value in (
                ("autocomp_window_step", "Step of the latest window.", summary.step),
                (
                    "autocomp_bandwidth_bytes_per_second",
                    "Live link bandwidth fit.",
                    summary.bandwidth_bytes_per_s,
                ),
                ("autocomp_latency_seconds", "Live per-hop latency fit.", summary.latency_s),
                (
                    "autocomp_nic_bytes_per_second",
                    "Bytes/s sent on the interface torch.distributed uses.",
                    summary.nic_bytes_per_s,
                ),
                ("autocomp_step_seconds", "Median training step time.", summary.step_seconds),
                (
                    "autocomp_backward_seconds",
                    "Median backward compute time.",
                    summary.backward_seconds,
                ),
                (
                    "autocomp_exposed_seconds",
                    "Median communication left after the backward.",
                    summary.exposed_seconds,
                ),
                (
                    "autocomp_overlap_measured",
                    "Fraction of communication hidden behind backward, measured.",
                    summary.measured_overlap,
                ),
                (
                    "autocomp_overlap_predicted",
                    "Overlap the previous decision predicted for this window.",
                    summary.predicted_overlap,
                ),
                (
                    "autocomp_wire_bytes_per_step",
                    "Wire bytes one rank sent per step.",
                    summary.bytes_per_step,
                ),
                (
                    "autocomp_uncompressed_bytes_per_step",
                    "Bytes per step plain all-reduce would send.",
                    summary.uncompressed_bytes_per_step,
                ),
                (
                    "autocomp_compression_ratio",
                    "Uncompressed bytes / wire bytes per step.",
                    summary.compression_ratio,
                ),
                ("autocomp_loss", "Mean loss over the latest window.", summary.loss),
            ):
                if value is not None:
                    yield _gauge(name, doc, float(value))

        layers = GaugeMetricFamily(
            "autocomp_layer_wire_bytes",
            "Predicted wire bytes per step of one layer under its current compressor.",
            labels=["layer", "compressor"],
        )
        for plan in layer_plans(meta, reader.decisions()):
            if plan.wire_bytes is not None:
                layers.add_metric([plan.name, plan.compressor or ""], plan.wire_bytes)
        yield layers

        guards = CounterMetricFamily(
            "autocomp_guard_events", "Convergence-guard events by guard.", labels=["guard"]
        )
        counts = {name: 0 for name in GUARD_NAMES}
        counts.update({str(k): int(v) for k, v in reader.guard_counts().items()})
        for name, count in sorted(counts.items()):
            guards.add_metric([name], float(count))
        yield guards

        pending = sum(1 for o in reader.overrides() if o.get("applied_step") is None)
        yield _gauge(
            "autocomp_overrides_pending", "Operator overrides not applied yet.", float(pending)
        )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def _error_page(run_dir: Path, message: str) -> str:
    """A human page for an unreadable run; it refreshes itself so it recovers on its own."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{RETRY_AFTER_SECONDS}">
<title>autocomp: run not available</title>
<style>body{{font:15px system-ui,sans-serif;margin:3em auto;max-width:46em;color:#222}}
code{{background:#f2f2f2;padding:.1em .3em}} .box{{border-left:4px solid #c0392b;
padding:.5em 1em;background:#fdf2f1}}</style></head>
<body><h1>Run not available</h1>
<div class="box"><p id="error-message">{html.escape(message)}</p></div>
<p>The sidecar serves the run log in <code>{html.escape(str(run_dir))}</code>.
It is missing, still being created by the trainer, or not an autocomp run log.
This page retries every {RETRY_AFTER_SECONDS} seconds.</p>
<p>Liveness: <a href="healthz">healthz</a></p></body></html>
"""


def create_app(
    run_dir: Path, *, token: str, reader_factory: ReaderFactory | None = None
) -> FastAPI:
    """The sidecar app for one run directory.

    ``token`` guards the only writing endpoint (``POST /api/overrides``). ``reader_factory``
    opens the run log (default: ``autocomp.runlog.RunReader``); it exists for tests.
    """
    if not token:
        raise ValueError("create_app needs a non-empty token for POST /api/overrides")
    run_dir = Path(run_dir)
    factory: ReaderFactory = reader_factory or RunReader
    expected = token.encode()
    dashboard = (
        importlib.resources.files("autocomp.service")
        .joinpath("dashboard.html")
        .read_text(encoding="utf-8")
    )

    @contextlib.contextmanager
    def open_run(*, snapshot: bool = True) -> Iterator[Reader]:
        """One reader per request; every failure to read becomes RunUnavailable.

        With ``snapshot`` all reads of the request see one committed state of the log (a
        window written between two queries cannot make the plan and the meta disagree).
        """
        try:
            reader = factory(run_dir)
        except (RunLogError, OSError, sqlite3.Error) as exc:
            raise RunUnavailable(str(exc) or type(exc).__name__) from exc
        try:
            with reader.snapshot() if snapshot else contextlib.nullcontext():
                yield reader
        except (RunLogError, sqlite3.Error, json.JSONDecodeError) as exc:
            raise RunUnavailable(f"run log unreadable: {exc}") from exc
        finally:
            close = getattr(reader, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()

    app = FastAPI(
        title="autocomp sidecar",
        description="Live view of one autocomp run: plan, reasons, link, guards; overrides.",
        version="1",
        # The interactive docs pages load their scripts from a CDN; /openapi.json stays.
        docs_url=None,
        redoc_url=None,
    )
    app.state.run_dir = run_dir

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_RunCollector(open_run))

    @app.exception_handler(RunUnavailable)
    async def _unavailable(request: Request, exc: RunUnavailable) -> Response:
        return JSONResponse(
            {"detail": f"run log not available: {exc}"},
            status.HTTP_503_SERVICE_UNAVAILABLE,
            {"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        # A message instead of a bare 500. Starlette re-raises afterwards, so the server logs
        # the traceback (to the sidecar's log, never to the client).
        logger.error("%s %s failed: %r", request.method, request.url.path, exc)
        return JSONResponse(
            {"detail": f"internal error in the sidecar ({type(exc).__name__}); see its log"},
            status.HTTP_500_INTERNAL_SERVER_ERROR,
        )

    @app.middleware("http")
    async def _headers(request: Request, call_next: Callable[[Request], Any]) -> Response:
        response: Response = await call_next(request)
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    def require_token(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
    ) -> None:
        """Constant-time comparison, so response timing does not leak the token."""
        supplied = b"" if credentials is None else credentials.credentials.encode()
        if credentials is None or not hmac.compare_digest(supplied, expected):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                detail="missing or wrong bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("policy")

    @app.get("/policy", response_class=HTMLResponse, summary="Dashboard page")
    def policy_page() -> HTMLResponse:
        """The dashboard; it polls the JSON API itself. An unreadable run gets an error page."""
        try:
            with open_run() as reader:
                reader.meta()
        except RunUnavailable as exc:
            return HTMLResponse(
                _error_page(run_dir, str(exc)),
                status.HTTP_503_SERVICE_UNAVAILABLE,
                {"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        return HTMLResponse(dashboard)

    @app.get("/api/policy", response_model=PolicyResponse)
    def api_policy() -> PolicyResponse:
        """The current plan (per-layer compressor, bytes, ratio, reason), run meta, last window."""
        with open_run() as reader:
            meta = reader.meta()
            window = reader.latest_window()
            decisions = reader.decisions()
        step = max((int(d["step"]) for d in decisions), default=None)
        if step is None and window is not None:
            step = int(window["step"])
        return PolicyResponse(
            run=RunMeta(**{k: v for k, v in meta.items() if k != "layers"}),
            step=step,
            window=window_summary(window),
            layers=layer_plans(meta, decisions),
        )

    @app.get("/api/decisions", response_model=DecisionsResponse)
    def api_decisions(
        since: int | None = Query(None, ge=0, description="Only changes after this step."),
    ) -> DecisionsResponse:
        """Compressor switches after ``since`` (with reasons) and the latest per-layer reasons."""
        with open_run() as reader:
            latest = reader.decisions()
            raw_changes = reader.changes(since_step=since)
            steps = sorted({int(c["step"]) for c in raw_changes})[-MAX_CHANGE_STEPS_WITH_REASONS:]
            reasons = {
                (int(d["step"]), d["name"]): d.get("reason")
                for s in steps
                for d in reader.decisions(step=s)
            }
        changes = [
            Change(
                step=int(c["step"]),
                name=c["name"],
                old_spec=c.get("old_spec"),
                new_spec=c.get("new_spec"),
                reason=reasons.get((int(c["step"]), c["name"])),
            )
            for c in raw_changes
            if since is None or int(c["step"]) > since
        ]
        changes.sort(key=lambda c: (c.step, c.name))
        return DecisionsResponse(
            since=since,
            latest_step=max((int(d["step"]) for d in latest), default=None),
            changes=changes,
            decisions=[Decision(**d) for d in latest],
        )

    @app.get("/api/guards", response_model=GuardsResponse)
    def api_guards(
        since: int | None = Query(None, ge=0, description="Only events after this step."),
        limit: int = Query(200, ge=1, le=1000, description="At most this many events."),
    ) -> GuardsResponse:
        """Guard event counts over the run and the latest events (the guard timeline)."""
        with open_run() as reader:
            counts = reader.guard_counts()
            events = reader.guard_events(since_step=since, limit=limit)
        models = [GuardEventModel(**e) for e in events]
        models.sort(key=lambda e: (e.step, e.id if e.id is not None else 0))
        return GuardsResponse(counts={str(k): int(v) for k, v in counts.items()}, events=models)

    @app.get("/api/bandwidth", response_model=SeriesResponse)
    def api_bandwidth(
        limit: int = Query(2000, ge=1, le=10000, description="At most this many windows."),
    ) -> SeriesResponse:
        """Per-window series for the charts: bandwidth, step time, overlap, compression ratio."""
        with open_run() as reader:
            series = reader.series(limit=limit)
            target = _finite(reader.meta().get("target_overlap"))
        # The run log names the bandwidth column by its unit; the API keeps the short name.
        series = {"bandwidth": series.get("bandwidth_bytes_per_s", []), **series}
        lists = {
            key: [_finite(v) for v in series.get(key) or []]
            for key in SeriesResponse.model_fields
            if key not in ("step", "target_overlap")
        }
        return SeriesResponse(
            step=[int(s) for s in series.get("step") or []], target_overlap=target, **lists
        )

    @app.get("/api/overrides", response_model=OverridesResponse)
    def api_overrides(
        limit: int = Query(100, ge=1, le=1000),
    ) -> OverridesResponse:
        """Stored overrides, newest first, with whether the controller applied them."""
        with open_run() as reader:
            rows = reader.overrides(limit=limit)
        models = [Override(**row) for row in rows]
        models.sort(key=lambda o: o.id, reverse=True)
        return OverridesResponse(overrides=models)

    @app.post(
        "/api/overrides",
        response_model=Override,
        status_code=status.HTTP_201_CREATED,
        dependencies=[Depends(require_token)],
        responses={401: {"description": "Missing or wrong bearer token."}},
    )
    def post_override(body: OverrideRequest) -> Override | JSONResponse:
        """Queue an override; the controller applies it at the next window boundary."""
        # No snapshot: the override written below must be visible to the read that follows.
        with open_run(snapshot=False) as reader:
            names = [str(layer["name"]) for layer in reader.meta().get("layers") or []]
            try:
                fields = validate_override(body, names)
            except ValueError as exc:
                return JSONResponse({"detail": str(exc)}, status.HTTP_422_UNPROCESSABLE_CONTENT)
            new_id = reader.add_override(body.kind, who=body.who, **fields)
            row = next((o for o in reader.overrides() if int(o["id"]) == int(new_id)), None)
        logger.info(
            "override %s queued by %s: kind=%s glob=%s spec=%s",
            new_id,
            body.who,
            body.kind,
            fields["glob"],
            fields["spec"],
        )
        if row is None:
            row = {"id": new_id, "who": body.who, "kind": body.kind, **fields, "status": "pending"}
        return Override(**row)

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        """Liveness: always 200 while the sidecar runs; says whether the run log is readable."""
        try:
            with open_run() as reader:
                window = reader.latest_window()
        except RunUnavailable as exc:
            return Health(run_readable=False, run_dir=str(run_dir), detail=str(exc))
        return Health(
            run_readable=True,
            run_dir=str(run_dir),
            latest_step=None if window is None else int(window["step"]),
        )

    @app.get("/metrics", summary="Prometheus metrics")
    def metrics() -> Response:
        """Prometheus text format, read from the run log at scrape time."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
