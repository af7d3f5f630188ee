"""What the sidecar shows, worked out from run-log rows: the API's models and the error page.

Pure functions of what :class:`~autocomp.runlog.RunReader` returns (no HTTP, no I/O), shared by
the JSON routes (:mod:`autocomp.service.app`) and the Prometheus collector
(:mod:`autocomp.service.metrics`), so the dashboard and the metrics cannot disagree about a
number. Also the :class:`Reader` protocol both consume, and the one error they turn every
unreadable run log into.
"""

from __future__ import annotations

import contextlib
import fnmatch
import html
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from autocomp.compressors import build_compressor
from autocomp.service.schemas import LayerPlan, OverrideRequest, WindowSummary

RETRY_AFTER_SECONDS = 5
"""What a 503 tells clients (and the error page's auto-refresh) to wait before retrying."""

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


def finite(value: Any) -> float | None:
    """JSON has no NaN/Inf: they become None (unknown) rather than an invalid document."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _ratio(uncompressed: Any, wire: Any) -> float | None:
    raw, sent = finite(uncompressed), finite(wire)
    if raw is None or sent is None or sent <= 0:
        return None
    return raw / sent


def window_summary(window: Mapping[str, Any] | None) -> WindowSummary | None:
    """The flat columns of a run-log window row, with the compression ratio worked out."""
    if window is None:
        return None
    record = window.get("record")
    extra = record if isinstance(record, Mapping) else {}
    fields = {
        name: finite(window.get(name, extra.get(name)))
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
    predicted = finite(decision.get("predicted_wire_bytes"))
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
        predicted_seconds=finite(decision.get("predicted_seconds")),
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


def error_page(run_dir: Path, message: str) -> str:
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
