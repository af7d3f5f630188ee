"""Tier 1: the sidecar (``autocomp.service``) in-process, plus one real-socket test.

The run directory is written through the real run-log writer (``autocomp.runlog.RunLog``)
with window records built like the adaptive loop builds them: a real ``PolicyEngine`` decides
for a small transformer-like model while the link slows from 2 Gbit/s to 100 Mbit/s, so the
plan changes, reasons are the engine's own, and guards fire along the way. Against it, every
endpoint and schema is checked with FastAPI's TestClient: the plan table (ratio = raw / wire
bytes), decisions since a step, guards, series, Prometheus metrics (parsed with
prometheus_client's parser), health, overrides with bearer auth (401 without or with a wrong
token, 201 with the right one, 422 with a message for bad input), and unreadable run
directories (missing, empty, foreign, garbage, truncated, other schema version, locked), which
give a human 503 while /healthz still answers. The real-socket test starts
``autocomp-sidecar`` as its own process, talks to it over HTTP, kills it while a "trainer"
keeps writing, and leaves no process behind.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from autocomp.adaptive import WindowRecord
from autocomp.compressors import Collective, Compressor, build_compressor
from autocomp.policy import LayerProfile, PolicyEngine, StepTiming, load_policy
from autocomp.runlog import DB_NAME, RunLog
from autocomp.service.app import create_app
from autocomp.service.sidecar import (
    LOG_NAME,
    SidecarError,
    main,
    sidecar_url,
    start_sidecar_process,
    stop_sidecar_process,
    wait_until_healthy,
)

TOKEN = "test-token-5f1c2a"
RUN_ID = "20250101-000000-abcdef"
WORLD = 4
TARGET = 0.9
WINDOW = 20

LAYERS: list[tuple[str, tuple[int, ...]]] = [
    ("embed.weight", (512, 256)),
    ("blocks.0.attn.qkv.weight", (768, 256)),
    ("blocks.0.attn.qkv.bias", (768,)),
    ("blocks.0.attn.proj.weight", (256, 256)),
    ("blocks.0.mlp.fc1.weight", (1024, 256)),
    ("blocks.0.mlp.fc2.weight", (256, 1024)),
    ("blocks.0.ln.weight", (256,)),
    ("head.weight", (512, 256)),
]
BANDWIDTH_MBIT = [None, 2000, 2000, 2000, 2000, 800, 800, 400, 200, 200, 100, 100, 100, 150]
"""Link per window (Mbit/s); the first window has no fit yet."""


class _LinkCost:
    """Ring alpha-beta cost model on one link, like the test double of the engine's tests."""

    def __init__(self, mbit: float | None) -> None:
        self._bandwidth = None if mbit is None else mbit * 1e6 / 8

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        return self._bandwidth

    def comm_seconds(self, collective: Collective, payload_bytes: int, world_size: int) -> float:
        hops = world_size - 1
        bandwidth = self._bandwidth or 1.25e9
        if collective is Collective.ALL_REDUCE:
            return 2 * hops * 50e-6 + 2 * hops / world_size * payload_bytes / bandwidth
        return hops * 50e-6 + hops * payload_bytes / bandwidth

    def compress_seconds(
        self, compressor: Compressor, shape: torch.Size, nonzero_share: float = 1.0
    ) -> float:
        return 0.0 if compressor.name == "none" else 2e-9 * shape.numel()

    def contention_rate(self) -> float:
        return 0.0

    def half_sum_seconds_per_element(self, dtype: torch.dtype) -> float:
        return 0.0


def _meta() -> dict[str, Any]:
    return {
        "world_size": WORLD,
        "policy": "default",
        "target_overlap": TARGET,
        "window": WINDOW,
        "layers": [
            {
                "name": name,
                "shape": list(shape),
                "numel": int(torch.Size(shape).numel()),
                "dtype": str(torch.float32),
            }
            for name, shape in LAYERS
        ],
    }


def _guard_events(step: int) -> list[dict[str, Any]]:
    events = {
        100: [("warmup", None, "step 100 >= warmup_steps 100", "enable compression")],
        220: [
            (
                "loss_divergence",
                None,
                "loss 3.91 > 1.5 x running mean 2.41",
                "back off 1 level on every layer",
            )
        ],
        240: [
            (
                "residual_growth",
                "blocks.0.mlp.fc1.weight",
                "residual norm 4.2 > 3 x gradient norm 1.3",
                "EF reset + back off 1 level",
            ),
            ("critical_regime", "head.weight", "grad norm changed 61% > 50%", "back off 1 level"),
        ],
        280: [("recovered", "blocks.0.mlp.fc1.weight", "quiet for 40 steps", "recover 1 level")],
    }
    return [
        {"step": step, "guard": g, "layer": layer, "detail": detail, "action": action}
        for g, layer, detail, action in events.get(step, [])
    ]


def populate_run(run_dir: Path) -> dict[str, Any]:
    """Write a realistic run log into ``run_dir``; return what was written, for assertions."""
    rules = load_policy("default")
    shapes = {name: torch.Size(shape) for name, shape in LAYERS}
    raw = {name: shape.numel() * 4 for name, shape in shapes.items()}
    plan = {name: "none" for name, _ in LAYERS}
    previous_prediction: float | None = None
    records: list[dict[str, Any]] = []
    with RunLog.open(run_dir, run_id=RUN_ID, meta=_meta()) as log:
        for index, mbit in enumerate(BANDWIDTH_MBIT):
            step = (index + 1) * WINDOW
            cost = _LinkCost(mbit)
            engine = PolicyEngine(rules, cost, target_overlap=TARGET)
            profiles = [
                LayerProfile(name=name, shape=shapes[name], grad_norm=1.0 + 0.1 * i)
                for i, (name, _) in enumerate(LAYERS)
            ]
            timing = StepTiming(backward_seconds=0.08, hideable_seconds=0.06, step_seconds=0.15)
            decision = engine.decide(profiles, timing, step, WORLD)
            # Bytes and timings of the window just measured come from the *previous* plan.
            wire = sum(build_compressor(plan[n]).wire_bytes(shapes[n], torch.float32) for n in plan)
            bandwidth = None if mbit is None else mbit * 1e6 / 8
            comm = 2 * (WORLD - 1) / WORLD * wire / (bandwidth or 1.25e9)
            exposed = max(0.0, comm - 0.06)
            new_plan = {d.name: d.spec for d in decision.layers}
            changes = {n: (plan[n], new_plan[n]) for n in plan if plan[n] != new_plan[n]}
            record = WindowRecord(
                step=step,
                bandwidth_bytes_per_s=bandwidth,
                latency_s=None if mbit is None else 50e-6,
                nic_bytes_per_s=None if mbit is None else bandwidth * 0.8,
                step_seconds=0.12 + exposed,
                backward_seconds=0.08,
                hideable_seconds=0.06,
                comm_busy_seconds=comm,
                compress_seconds=0.002,
                exposed_seconds=exposed,
                measured_overlap=1.0 - exposed / (comm + 0.002),
                predicted_overlap=previous_prediction,
                bytes_per_step=float(wire),
                uncompressed_bytes_per_step=float(sum(raw.values())),
                loss=4.0 - 0.1 * index,
                changes=changes,
                decision=decision.to_dict(),
                guard_events=_guard_events(step),
                node_link_bytes_per_s=None if mbit is None else 2.5e9,  # a hierarchical run
            ).to_dict()
            log.append_window(record)
            records.append(record)
            plan = new_plan
            previous_prediction = decision.predicted_overlap
        assert log.flush(10.0)
    return {"records": records, "plan": plan, "raw": raw}


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("run") / RUN_ID
    return run_dir, populate_run(run_dir)


@pytest.fixture
def client(populated: tuple[Path, dict[str, Any]]) -> Iterator[TestClient]:
    with TestClient(create_app(populated[0], token=TOKEN)) as test_client:
        yield test_client


@pytest.fixture
def fresh_client(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    """A client on a run of its own, for tests that write overrides."""
    run_dir = tmp_path / RUN_ID
    populate_run(run_dir)
    with TestClient(create_app(run_dir, token=TOKEN)) as test_client:
        yield test_client, run_dir


def _auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---- read API -----------------------------------------------------------------------------


def test_the_data_set_is_realistic(populated: tuple[Path, dict[str, Any]]) -> None:
    """The fixture itself: the plan changes more than once and compresses big layers."""
    _, written = populated
    changed_steps = {r["step"] for r in written["records"] if r["changes"]}
    assert len(changed_steps) >= 2
    assert written["plan"]["embed.weight"] != "none"
    assert written["plan"]["blocks.0.attn.qkv.bias"] == "none"


def test_api_policy_is_the_current_plan(
    client: TestClient, populated: tuple[Path, dict[str, Any]]
) -> None:
    _, written = populated
    response = client.get("/api/policy")
    assert response.status_code == 200
    body = response.json()
    last = written["records"][-1]
    assert body["step"] == last["step"]
    assert body["run"]["run_id"] == RUN_ID
    assert body["run"]["world_size"] == WORLD
    assert body["run"]["target_overlap"] == TARGET
    assert body["run"]["policy"] == "default"
    assert isinstance(body["run"]["created"], float)
    assert [layer["name"] for layer in body["layers"]] == [name for name, _ in LAYERS]
    decided = {d["name"]: d for d in last["decision"]["layers"]}
    for layer in body["layers"]:
        name = layer["name"]
        assert layer["compressor"] == written["plan"][name] == decided[name]["spec"]
        assert layer["reason"] == decided[name]["reason"]
        assert layer["rule"] == decided[name]["rule"]
        assert layer["shape"] == list(dict(LAYERS)[name])
        assert layer["dtype"] == "torch.float32"
        assert layer["uncompressed_bytes"] == written["raw"][name]
        assert layer["wire_bytes"] == decided[name]["predicted_wire_bytes"]
        assert layer["ratio"] == pytest.approx(written["raw"][name] / layer["wire_bytes"])
    by_name = {layer["name"]: layer for layer in body["layers"]}
    assert by_name["embed.weight"]["ratio"] > 1.5
    assert by_name["blocks.0.attn.qkv.bias"]["ratio"] == pytest.approx(1.0)
    window = body["window"]
    assert window["step"] == last["step"]
    assert window["bandwidth_bytes_per_s"] == pytest.approx(150e6 / 8)
    assert window["compression_ratio"] == pytest.approx(
        last["uncompressed_bytes_per_step"] / last["bytes_per_step"]
    )
    assert window["predicted_overlap"] == pytest.approx(
        written["records"][-2]["decision"]["predicted_overlap"]
    )
    assert "record" not in window


def test_both_link_levels_in_api_and_metrics(
    client: TestClient, populated: tuple[Path, dict[str, Any]]
) -> None:
    last = populated[1]["records"][-1]
    window = client.get("/api/policy").json()["window"]
    assert window["bandwidth_bytes_per_s"] == last["bandwidth_bytes_per_s"]
    assert window["node_link_bytes_per_s"] == last["node_link_bytes_per_s"]
    assert last["node_link_bytes_per_s"] is not None
    metrics = client.get("/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("autocomp_node_link_bytes"))
    assert float(line.split()[-1]) == last["node_link_bytes_per_s"]


def test_api_decisions_since_a_step(
    client: TestClient, populated: tuple[Path, dict[str, Any]]
) -> None:
    _, written = populated
    records = written["records"]
    every = client.get("/api/decisions").json()
    expected = [
        (r["step"], name, old, new)
        for r in records
        for name, (old, new) in sorted(r["changes"].items())
    ]
    assert [(c["step"], c["name"], c["old_spec"], c["new_spec"]) for c in every["changes"]] == (
        expected
    )
    reasons = {
        (r["step"], d["name"]): d["reason"] for r in records for d in r["decision"]["layers"]
    }
    for change in every["changes"]:
        assert change["reason"] == reasons[(change["step"], change["name"])]
        assert change["reason"]
    assert every["since"] is None
    assert every["latest_step"] == records[-1]["step"]
    assert [d["name"] for d in every["decisions"]] == [name for name, _ in LAYERS]
    assert all(d["step"] == records[-1]["step"] for d in every["decisions"])

    middle = sorted({c["step"] for c in every["changes"]})[0]
    later = client.get("/api/decisions", params={"since": middle}).json()
    assert later["since"] == middle
    assert later["changes"] == [c for c in every["changes"] if c["step"] > middle]
    assert client.get("/api/decisions", params={"since": 10**9}).json()["changes"] == []
    assert client.get("/api/decisions", params={"since": -1}).status_code == 422


def test_api_guards(client: TestClient, populated: tuple[Path, dict[str, Any]]) -> None:
    _, written = populated
    body = client.get("/api/guards").json()
    events = [e for r in written["records"] for e in r["guard_events"]]
    assert body["counts"] == {
        "critical_regime": 1,
        "loss_divergence": 1,
        "recovered": 1,
        "residual_growth": 1,
        "warmup": 1,
    }
    assert [(e["step"], e["guard"], e["layer"], e["action"]) for e in body["events"]] == [
        (e["step"], e["guard"], e["layer"], e["action"]) for e in events
    ]
    assert all(isinstance(e["id"], int) and e["detail"] for e in body["events"])
    assert [e["step"] for e in client.get("/api/guards?since=240").json()["events"]] == [280]
    assert len(client.get("/api/guards?limit=2").json()["events"]) == 2


def test_api_bandwidth_series(client: TestClient, populated: tuple[Path, dict[str, Any]]) -> None:
    _, written = populated
    body = client.get("/api/bandwidth").json()
    records = written["records"]
    n = len(records)
    assert body["step"] == [r["step"] for r in records]
    for key in (
        "time",
        "bandwidth",
        "latency_s",
        "step_seconds",
        "measured_overlap",
        "predicted_overlap",
        "compression_ratio",
        "bytes_per_step",
        "loss",
    ):
        assert len(body[key]) == n, key
    assert body["bandwidth"][0] is None
    assert body["bandwidth"][1:] == pytest.approx([m * 1e6 / 8 for m in BANDWIDTH_MBIT[1:]])
    assert body["compression_ratio"] == pytest.approx(
        [r["uncompressed_bytes_per_step"] / r["bytes_per_step"] for r in records]
    )
    assert body["target_overlap"] == TARGET
    assert len(client.get("/api/bandwidth?limit=3").json()["step"]) == 3


def test_openapi_documents_the_schemas(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    for name in ("PolicyResponse", "LayerPlan", "DecisionsResponse", "GuardsResponse"):
        assert name in components
    ratio = components["LayerPlan"]["properties"]["ratio"]
    assert "uncompressed_bytes / wire_bytes" in ratio["description"]
    assert client.get("/docs").status_code == 404  # the Swagger page would load a CDN


def test_metrics_parse_as_prometheus_text(
    client: TestClient, populated: tuple[Path, dict[str, Any]]
) -> None:
    _, written = populated
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    last = written["records"][-1]

    def value(name: str) -> float:
        (sample,) = families[name].samples
        return sample.value

    assert value("autocomp_run_up") == 1.0
    assert value("autocomp_bandwidth_bytes_per_second") == pytest.approx(150e6 / 8)
    assert value("autocomp_latency_seconds") == pytest.approx(50e-6)
    assert value("autocomp_step_seconds") == pytest.approx(last["step_seconds"])
    assert value("autocomp_overlap_measured") == pytest.approx(last["measured_overlap"])
    assert value("autocomp_overlap_predicted") == pytest.approx(last["predicted_overlap"])
    assert value("autocomp_wire_bytes_per_step") == pytest.approx(last["bytes_per_step"])
    assert value("autocomp_compression_ratio") == pytest.approx(
        last["uncompressed_bytes_per_step"] / last["bytes_per_step"]
    )
    assert value("autocomp_target_overlap") == TARGET
    assert value("autocomp_window_step") == last["step"]
    assert value("autocomp_overrides_pending") == 0
    info = families["autocomp_run_info"].samples[0]
    assert info.labels["run_id"] == RUN_ID and info.value == 1.0

    layers = {s.labels["layer"]: s for s in families["autocomp_layer_wire_bytes"].samples}
    assert set(layers) == {name for name, _ in LAYERS}
    decided = {d["name"]: d for d in last["decision"]["layers"]}
    for name, sample in layers.items():
        assert sample.labels["compressor"] == decided[name]["spec"]
        assert sample.value == decided[name]["predicted_wire_bytes"]

    guards = families["autocomp_guard_events"]
    assert guards.type == "counter"
    counts = {s.labels["guard"]: s.value for s in guards.samples if s.name.endswith("_total")}
    assert counts["loss_divergence"] == 1
    assert counts["nonfinite"] == 0  # every guard is exported, fired or not


def test_healthz(client: TestClient, populated: tuple[Path, dict[str, Any]]) -> None:
    body = client.get("/healthz").json()
    assert body["status"] == "ok"
    assert body["run_readable"] is True
    assert body["detail"] is None
    assert body["latest_step"] == populated[1]["records"][-1]["step"]


def test_dashboard_page_is_self_contained(client: TestClient) -> None:
    response = client.get("/policy")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    for element in ('id="plan-body"', 'id="chart-bandwidth"', 'id="timeline"', "api/policy"):
        assert element in page
    # Nothing loads from elsewhere: no external URL at all, and the CSP forbids it anyway.
    assert "http://" not in page and "https://" not in page
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert client.get("/", follow_redirects=False).headers["location"] == "policy"


# ---- overrides ------------------------------------------------------------------------------


def test_override_auth(fresh_client: tuple[TestClient, Path]) -> None:
    client, _ = fresh_client
    body = {"kind": "pin", "glob": "embed.*", "spec": "fp16", "who": "alice"}
    missing = client.post("/api/overrides", json=body)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert "bearer token" in missing.json()["detail"]
    wrong = client.post("/api/overrides", json=body, headers=_auth("not-the-token"))
    assert wrong.status_code == 401
    basic = client.post("/api/overrides", json=body, headers={"Authorization": "Basic eDp5"})
    assert basic.status_code == 401
    # Auth is checked before the body: an anonymous caller cannot probe validation.
    assert client.post("/api/overrides", json={"kind": "nope"}).status_code == 401
    assert client.get("/api/overrides").json() == {"overrides": []}

    created = client.post("/api/overrides", json=body, headers=_auth())
    assert created.status_code == 201
    row = created.json()
    assert row["kind"] == "pin" and row["glob"] == "embed.*"
    assert row["spec"] == build_compressor("fp16").spec
    assert row["who"] == "alice" and row["status"] == "pending" and row["applied_step"] is None
    assert isinstance(row["id"], int) and isinstance(row["created"], float)
    listed = client.get("/api/overrides").json()["overrides"]
    assert [o["id"] for o in listed] == [row["id"]]
    metrics = client.get("/metrics").text
    assert "autocomp_overrides_pending 1.0" in metrics


def test_override_kinds_and_controller_acknowledgement(
    fresh_client: tuple[TestClient, Path],
) -> None:
    client, run_dir = fresh_client
    posted = []
    for body in (
        {"kind": "pin", "glob": "blocks.*.weight", "spec": "topk:ratio=0.01"},
        {"kind": "unpin", "glob": "blocks.*.weight"},
        {"kind": "force_none"},
        {"kind": "unforce"},
        {"kind": "freeze", "who": "bob"},
        {"kind": "unfreeze", "glob": "", "spec": ""},  # empty strings count as absent
    ):
        response = client.post("/api/overrides", json=body, headers=_auth())
        assert response.status_code == 201, response.text
        posted.append(response.json())
    # Specs are stored canonical: the log shows exactly what will run.
    assert posted[0]["spec"] == build_compressor("topk:ratio=0.01").spec
    assert posted[0]["who"] == "api"
    assert [o["kind"] for o in client.get("/api/overrides").json()["overrides"]] == [
        "unfreeze",
        "freeze",
        "unforce",
        "force_none",
        "unpin",
        "pin",
    ]

    # The controller (the writer side) picks them up and acknowledges them at a boundary.
    with RunLog.open(run_dir, run_id=RUN_ID, meta=_meta()) as log:
        pending = log.pending_overrides()
        assert [o.id for o in pending] == [o["id"] for o in posted]
        log.mark_overrides_applied([o.id for o in pending[:-1]], step=400)
        log.mark_overrides_applied([pending[-1].id], step=400, status="rejected: nothing frozen")
        assert log.flush(10.0)
    rows = {o["id"]: o for o in client.get("/api/overrides").json()["overrides"]}
    assert rows[posted[0]["id"]]["status"] == "applied"
    assert rows[posted[0]["id"]]["applied_step"] == 400
    assert rows[posted[-1]["id"]]["status"] == "rejected: nothing frozen"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"kind": "pin", "glob": "*", "spec": "zstd:level=3"}, "unknown compressor 'zstd'"),
        ({"kind": "pin", "glob": "*", "spec": "topk:ratio=2"}, "out of range"),
        ({"kind": "pin", "glob": "*", "spec": "powersgd:rnk=4"}, "has no parameter 'rnk'"),
        ({"kind": "pin", "glob": "*"}, "needs a 'spec'"),
        ({"kind": "pin", "spec": "fp16"}, "needs a 'glob'"),
        ({"kind": "pin", "glob": "  ", "spec": "fp16"}, "needs a 'glob'"),
        ({"kind": "unpin"}, "needs a 'glob'"),
        ({"kind": "pin", "glob": "decoder.*", "spec": "fp16"}, "matches no layer"),
        ({"kind": "freeze", "glob": "*"}, "takes no 'glob'"),
        ({"kind": "force_none", "glob": "*"}, "takes no 'glob'"),
        ({"kind": "unpin", "glob": "*", "spec": "fp16"}, "only 'pin' takes a 'spec'"),
    ],
)
def test_bad_override_is_422_with_a_message(
    fresh_client: tuple[TestClient, Path], body: dict[str, Any], message: str
) -> None:
    client, _ = fresh_client
    response = client.post("/api/overrides", json=body, headers=_auth())
    assert response.status_code == 422
    assert message in response.json()["detail"]
    assert client.get("/api/overrides").json() == {"overrides": []}


def test_unknown_spec_message_lists_valid_compressors(
    fresh_client: tuple[TestClient, Path],
) -> None:
    client, _ = fresh_client
    response = client.post(
        "/api/overrides", json={"kind": "pin", "glob": "*", "spec": "zstd"}, headers=_auth()
    )
    assert "valid: " in response.json()["detail"] and "powersgd" in response.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "delete_everything"},
        {"glob": "*"},
        {"kind": "freeze", "extra": 1},
        {"kind": "freeze", "who": ""},
        {"kind": "pin", "glob": "*", "spec": "x" * 201},
    ],
)
def test_malformed_override_body_is_422(
    fresh_client: tuple[TestClient, Path], body: dict[str, Any]
) -> None:
    client, _ = fresh_client
    response = client.post("/api/overrides", json=body, headers=_auth())
    assert response.status_code == 422
    assert response.json()["detail"]


def test_create_app_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="non-empty token"):
        create_app(tmp_path, token="")


# ---- unreadable run directories -------------------------------------------------------------


def _foreign_db(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.commit()
    conn.close()


def _other_version(run_dir: Path) -> None:
    populate_run(run_dir)
    conn = sqlite3.connect(run_dir / DB_NAME)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()


def _truncated(run_dir: Path) -> None:
    populate_run(run_dir)
    db = run_dir / DB_NAME
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])


BROKEN_RUNS = {
    "missing": (lambda d: None, "no such run directory"),
    "empty directory": (lambda d: d.mkdir(), "no run.db"),
    "empty file": (lambda d: (d.mkdir(), (d / DB_NAME).write_bytes(b"")), "empty file"),
    "garbage": (
        lambda d: (d.mkdir(), (d / DB_NAME).write_bytes(b"\x00garbage" * 100)),
        "not an SQLite database",
    ),
    "foreign sqlite": (lambda d: (d.mkdir(), _foreign_db(d / DB_NAME)), "foreign SQLite"),
    "other schema version": (_other_version, "schema version 99"),
    "truncated": (_truncated, "truncated"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_RUNS))
def test_unreadable_run_gives_a_clear_error_and_healthz_answers(tmp_path: Path, case: str) -> None:
    make, message = BROKEN_RUNS[case]
    run_dir = tmp_path / "run"
    make(run_dir)
    with TestClient(create_app(run_dir, token=TOKEN), raise_server_exceptions=False) as client:
        page = client.get("/policy")
        assert page.status_code == 503
        assert page.headers["content-type"].startswith("text/html")
        assert "Run not available" in page.text and message in page.text
        assert "Traceback" not in page.text
        assert page.headers["retry-after"] == "5"

        for path in ("/api/policy", "/api/decisions", "/api/guards", "/api/bandwidth"):
            response = client.get(path)
            assert response.status_code == 503, path
            assert message in response.json()["detail"]
        posted = client.post("/api/overrides", json={"kind": "freeze"}, headers=_auth())
        assert posted.status_code == 503

        health = client.get("/healthz")
        assert health.status_code == 200
        assert health.json()["status"] == "ok"
        assert health.json()["run_readable"] is False
        assert message in health.json()["detail"]

        metrics = client.get("/metrics")
        assert metrics.status_code == 200
        families = {f.name: f for f in text_string_to_metric_families(metrics.text)}
        assert families["autocomp_run_up"].samples[0].value == 0.0
        assert "autocomp_bandwidth_bytes_per_second" not in families


def test_run_dir_appearing_later_is_picked_up(tmp_path: Path) -> None:
    """The sidecar may start before the trainer creates the run log."""
    run_dir = tmp_path / RUN_ID
    with TestClient(create_app(run_dir, token=TOKEN)) as client:
        assert client.get("/api/policy").status_code == 503
        populate_run(run_dir)
        assert client.get("/api/policy").status_code == 200
        assert client.get("/healthz").json()["run_readable"] is True


def test_locked_or_failing_database_is_503_not_500(
    populated: tuple[Path, dict[str, Any]],
) -> None:
    from autocomp.runlog import RunReader

    class LockedReader(RunReader):
        def latest_window(self) -> dict[str, Any] | None:
            raise sqlite3.OperationalError("database is locked")

    with TestClient(create_app(populated[0], token=TOKEN, reader_factory=LockedReader)) as client:
        response = client.get("/api/policy")
        assert response.status_code == 503
        assert "database is locked" in response.json()["detail"]
        assert client.get("/healthz").json()["run_readable"] is False


def test_unexpected_error_is_a_json_message_not_a_traceback(
    populated: tuple[Path, dict[str, Any]],
) -> None:
    from autocomp.runlog import RunReader

    class BuggyReader(RunReader):
        def series(self, limit: int = 2000) -> dict[str, list]:
            raise KeyError("boom")

    app = create_app(populated[0], token=TOKEN, reader_factory=BuggyReader)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/api/bandwidth")
    assert response.status_code == 500
    assert response.json() == {"detail": "internal error in the sidecar (KeyError); see its log"}


# ---- the sidecar process ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes once reaped or defunct.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--run-dir", "x", "--port", "70000"])
    assert exc.value.code == 2
    assert "--port must be in 1..65535" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([])  # --run-dir is required


def test_cli_prints_url_and_generated_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    seen: dict[str, Any] = {}

    def fake_run(self: uvicorn.Server, sockets: Any = None) -> None:
        seen["host"], seen["port"] = self.config.host, self.config.port
        self.started = True

    monkeypatch.setattr(uvicorn.Server, "run", fake_run)
    monkeypatch.delenv("AUTOCOMP_TOKEN", raising=False)
    assert main(["--run-dir", str(tmp_path), "--port", "9999"]) == 0
    out = capsys.readouterr().out
    assert "at http://127.0.0.1:9999/policy" in out
    assert "token for POST /api/overrides: " in out
    assert seen == {"host": "127.0.0.1", "port": 9999}

    monkeypatch.setenv("AUTOCOMP_TOKEN", "from-env")
    assert main(["--run-dir", str(tmp_path), "--port", "9999"]) == 0
    assert "token" not in capsys.readouterr().out  # a chosen token is never printed
    assert sidecar_url("::1", 80) == "http://[::1]:80"


@pytest.mark.timeout(180)
def test_sidecar_process_over_a_real_socket(tmp_path: Path) -> None:
    run_dir = tmp_path / RUN_ID
    populate_run(run_dir)
    port = free_port()
    url = sidecar_url("127.0.0.1", port)
    # The "trainer": rank 0's writer stays open the whole time, as in a real run.
    trainer_log = RunLog.open(run_dir, run_id=RUN_ID, meta=_meta())
    process = start_sidecar_process(run_dir, host="127.0.0.1", port=port, token=TOKEN)
    second: subprocess.Popen[bytes] | None = None
    try:
        assert "--token" not in process.args  # the token travels in the environment
        health = wait_until_healthy(url, timeout=90, process=process)
        assert health["status"] == "ok" and health["run_readable"] is True
        with httpx.Client(base_url=url, timeout=10, trust_env=False) as http:
            assert http.get("/healthz").json()["run_readable"] is True
            policy = http.get("/api/policy")
            assert policy.status_code == 200
            assert [layer["name"] for layer in policy.json()["layers"]] == [n for n, _ in LAYERS]
            posted = http.post(
                "/api/overrides", json={"kind": "freeze", "who": "ops"}, headers=_auth()
            )
            assert posted.status_code == 201
            assert http.post("/api/overrides", json={"kind": "freeze"}).status_code == 401

        # A sidecar whose port is taken fails fast, with its log in the message.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy_port = taken.getsockname()[1]
            second = start_sidecar_process(run_dir, host="127.0.0.1", port=busy_port, token="t")
            with pytest.raises(
                SidecarError, match=r"exited with code [1-9](.|\n)*address already in use"
            ):
                wait_until_healthy(
                    sidecar_url("127.0.0.1", busy_port) + "/healthz", timeout=90, process=second
                )

        # Killing the sidecar does not disturb the trainer: it keeps logging and sees the
        # override the sidecar stored.
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        trainer_log.append_window({"step": 10_000, "guard_events": [], "changes": {}})
        assert trainer_log.flush(10.0)
        assert [o.kind for o in trainer_log.pending_overrides()] == ["freeze"]
    finally:
        trainer_log.close()
        for proc in (process, second):
            if proc is not None:
                stop_sidecar_process(proc)
    assert process.returncode == -signal.SIGKILL
    assert second is not None and second.returncode not in (None, 0)
    assert not _alive(process.pid) and not _alive(second.pid)
    log = (run_dir / LOG_NAME).read_text()
    assert f"at {url}/policy" in log
    assert TOKEN not in log


@pytest.mark.timeout(120)
def test_sidecar_exits_with_its_parent(tmp_path: Path) -> None:
    """A trainer killed with SIGKILL cannot stop its sidecar; the sidecar notices and exits."""
    run_dir = tmp_path / RUN_ID
    populate_run(run_dir)
    port = free_port()
    pid_file = tmp_path / "sidecar.pid"
    launcher = (
        "import sys, time; from pathlib import Path\n"
        "from autocomp.service.sidecar import start_sidecar_process, wait_until_healthy\n"
        f"p = start_sidecar_process(Path({str(run_dir)!r}), host='127.0.0.1', port={port},"
        f" token='t')\n"
        f"wait_until_healthy('http://127.0.0.1:{port}', timeout=90, process=p)\n"
        f"Path({str(pid_file)!r}).write_text(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", launcher])
    try:
        deadline = time.monotonic() + 100
        while not pid_file.exists():
            assert parent.poll() is None, "launcher died"
            assert time.monotonic() < deadline, "sidecar did not come up"
            time.sleep(0.2)
        child = int(pid_file.read_text())
        assert _alive(child)
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 20
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child), "sidecar outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
