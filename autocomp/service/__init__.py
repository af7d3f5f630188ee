"""The autocomp sidecar: a small web service beside a training job.

It serves a live dashboard (``/policy``), a JSON API, Prometheus metrics and an authenticated
endpoint for operator overrides, all from the run log rank 0 writes. It runs as its own process
(``autocomp-sidecar`` or :func:`start_sidecar_process`) so serving HTTP never competes with the
trainer for its GIL, and killing it never affects training.

Names are resolved lazily: launching the sidecar from the trainer needs only the standard
library, serving needs the ``service`` extras (FastAPI, uvicorn, prometheus-client), and
``python -m autocomp.service.sidecar`` must not find its module imported already.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autocomp.service.app import create_app
    from autocomp.service.sidecar import (
        SidecarError,
        start_sidecar_process,
        stop_sidecar_process,
        wait_until_healthy,
    )

__all__ = [
    "SidecarError",
    "create_app",
    "start_sidecar_process",
    "stop_sidecar_process",
    "wait_until_healthy",
]

_HOMES = {
    "create_app": "autocomp.service.app",
    "SidecarError": "autocomp.service.sidecar",
    "start_sidecar_process": "autocomp.service.sidecar",
    "stop_sidecar_process": "autocomp.service.sidecar",
    "wait_until_healthy": "autocomp.service.sidecar",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
