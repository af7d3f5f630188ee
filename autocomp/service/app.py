"""The sidecar's web app: dashboard, JSON API, Prometheus metrics and operator overrides.

It only reads the run log the controller (rank 0) writes, and writes overrides through the
run log's own short transactions, so it can run, crash or be killed without touching training.
Each request opens the run log afresh: the trainer may create, rotate or finish it at any time,
and a broken or missing run log must produce a clear message (HTTP 503) rather than a stale
cached view or a 500 with a traceback.

This module is the HTTP layer (routes, authentication, headers, error handling); what the
routes show is worked out in :mod:`autocomp.service.views`, the metrics in
:mod:`autocomp.service.metrics`.
"""

from __future__ import annotations

import contextlib
import hmac
import importlib.resources
import json
import logging
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from autocomp.runlog import RunLogError, RunReader
from autocomp.service.metrics import RunCollector
from autocomp.service.schemas import (
    Change,
    Decision,
    DecisionsResponse,
    GuardEventModel,
    GuardsResponse,
    Health,
    Override,
    OverrideRequest,
    OverridesResponse,
    PolicyResponse,
    RunMeta,
    SeriesResponse,
)
from autocomp.service.views import (
    RETRY_AFTER_SECONDS,
    Reader,
    ReaderFactory,
    RunUnavailable,
    error_page,
    finite,
    layer_plans,
    validate_override,
    window_summary,
)

logger = logging.getLogger(__name__)

__all__ = ["RunUnavailable", "create_app"]

MAX_CHANGE_STEPS_WITH_REASONS = 50
"""Reasons for ``/api/decisions`` changes are looked up per step; cap the lookups per call."""

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
    registry.register(RunCollector(open_run))

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
                error_page(run_dir, str(exc)),
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
            target = finite(reader.meta().get("target_overlap"))
        # The run log names the bandwidth column by its unit; the API keeps the short name.
        series = {"bandwidth": series.get("bandwidth_bytes_per_s", []), **series}
        lists = {
            key: [finite(v) for v in series.get(key) or []]
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
