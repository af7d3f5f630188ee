"""Tier 3: the dashboard in a real browser (headless Chromium), served by a real sidecar.

A sidecar process serves a run directory written through the real run-log writer (the data
set of ``tests/test_service.py``); headless Chromium loads ``/policy``, runs its JavaScript
(polls of the JSON API) and dumps the resulting DOM. The test checks that the plan table
rendered one row per layer with the live compressor and reason of the latest decision, and
that the changes, guard and override tables and the status line were filled in. A second run
takes a 1400x1000 screenshot; with ``AUTOCOMP_UPDATE_SCREENSHOT=1`` it replaces
``docs/sidecar-dashboard.png``.

Needs Debian's ``chromium`` at /usr/bin/chromium (skipped otherwise; ``make test`` installs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

from autocomp.service.sidecar import (
    sidecar_url,
    start_sidecar_process,
    stop_sidecar_process,
    wait_until_healthy,
)
from tests.test_service import LAYERS, RUN_ID, TOKEN, free_port, populate_run

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "sidecar-dashboard.png"

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="chromium not installed; `make test` installs it"
    ),
]


def chromium(profile: Path, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with a throwaway profile and nothing that phones home."""
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        *args,
    ]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, cwd=profile
    )


class _Tables(HTMLParser):
    """Collects the text of every table cell, by the id of the enclosing ``tbody``."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: dict[str, list[dict[str, Any]]] = {}
        self.by_id: dict[str, str] = {}
        self._body: str | None = None
        self._row: dict[str, Any] | None = None
        self._cell: list[str] | None = None
        self._id_stack: list[tuple[str, str | None]] = []
        self._id_text: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        element_id = attr.get("id")
        self._id_stack.append((tag, element_id))
        if element_id:
            self._id_text[element_id] = []
        if tag == "tbody":
            self._body = element_id or ""
            self.bodies[self._body] = []
        elif tag == "tr" and self._body is not None:
            self._row = {"attrs": attr, "cells": []}
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        while self._id_stack:
            open_tag, element_id = self._id_stack.pop()
            if element_id:
                self.by_id[element_id] = "".join(self._id_text.pop(element_id, [])).strip()
            if open_tag == tag:
                break
        if tag == "td" and self._cell is not None and self._row is not None:
            self._row["cells"].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._body is not None:
            self.bodies[self._body].append(self._row)
            self._row = None
        elif tag == "tbody":
            self._body = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        for text in self._id_text.values():
            text.append(data)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    run_dir = tmp_path_factory.mktemp("browser") / RUN_ID
    populate_run(run_dir)
    port = free_port()
    process = start_sidecar_process(run_dir, host="127.0.0.1", port=port, token=TOKEN)
    url = sidecar_url("127.0.0.1", port)
    try:
        wait_until_healthy(url, timeout=90, process=process)
        # One override, so the overrides table has a row to show.
        httpx.post(
            url + "/api/overrides",
            json={"kind": "pin", "glob": "head.weight", "spec": "fp16", "who": "alice"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
            trust_env=False,
        ).raise_for_status()
        yield url, run_dir
    finally:
        stop_sidecar_process(process)


def test_dashboard_renders_the_live_plan(sidecar: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = sidecar
    policy = httpx.get(url + "/api/policy", timeout=10, trust_env=False).json()
    result = chromium(tmp_path, "--dump-dom", url + "/policy")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    tables = _Tables()
    tables.feed(dom)

    rows = [r for r in tables.bodies["plan-body"] if "data-layer" in r["attrs"]]
    assert [r["attrs"]["data-layer"] for r in rows] == [name for name, _ in LAYERS]
    for row, layer in zip(rows, policy["layers"], strict=True):
        name, shape, compressor, ratio, _wire, _raw, reason = row["cells"]
        assert name == layer["name"]
        assert compressor == layer["compressor"]
        assert reason == layer["reason"]
        assert shape == "\u00d7".join(str(n) for n in layer["shape"])
        assert ratio.endswith("\u00d7") and float(ratio[:-1]) == pytest.approx(
            layer["ratio"], rel=1e-2
        )
    assert any(r["cells"][2].startswith(("powersgd", "topk", "int8", "fp16")) for r in rows)

    changes = tables.bodies["changes-body"]
    assert changes and all(len(r["cells"]) == 5 for r in changes)
    assert {r["cells"][1] for r in changes} <= {name for name, _ in LAYERS}
    guards = tables.bodies["guard-body"]
    assert {r["attrs"].get("data-guard") for r in guards} >= {"loss_divergence", "recovered"}
    overrides = tables.bodies["overrides-body"]
    assert overrides[0]["cells"][1:3] == ["pin", "head.weight"]
    assert overrides[0]["cells"][-1] == "pending"

    assert tables.by_id["run-id"] == RUN_ID
    assert tables.by_id["run-step"] == str(policy["step"])
    assert tables.by_id["status"].startswith("updated")
    assert tables.by_id["card-bandwidth"].endswith("Mbit/s")
    assert "Cannot read" not in tables.by_id.get("banner", "")


def test_dashboard_screenshot(sidecar: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = sidecar
    target = tmp_path / "dashboard.png"
    result = chromium(
        tmp_path,
        "--hide-scrollbars",
        "--window-size=1400,1000",
        f"--screenshot={target}",
        url + "/policy",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    data = target.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000
    if os.environ.get("AUTOCOMP_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(target, SCREENSHOT)
