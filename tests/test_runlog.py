"""Tier 1: pure unit, no torch.distributed; one test uses a subprocess killed with SIGKILL.

Covers :mod:`autocomp.runlog`, the per-run SQLite log the controller writes on rank 0 and the
sidecar reads from another process:

- window records (shaped like ``WindowRecord.to_dict()``) round-trip into the flat columns, the
  per-layer decision table, the plan changes and the guard events; meta is stored and resumable;
- ``append_window`` never waits for the disk: with a writer slowed to 200 ms per batch it still
  returns in microseconds, and a full queue drops the oldest record (counted, warned once);
- retention keeps the newest ``max_windows`` windows and deletes the older per-layer rows;
- a reader polling while 500 windows are written sees monotonic, complete snapshots;
- a writer process killed with SIGKILL leaves a readable database with everything committed;
- missing, foreign, non-SQLite, corrupt, truncated and other-version files raise RunLogError;
- overrides go add -> pending -> marked applied, and are never handed out twice.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from autocomp import runlog
from autocomp.runlog import (
    SCHEMA_VERSION,
    RunLog,
    RunLogError,
    RunReader,
    default_run_dir,
    new_run_id,
)

pytestmark = pytest.mark.timeout(60)

LAYERS = ["encoder.weight", "encoder.bias", "head.weight"]
META = {
    "world_size": 4,
    "policy": "cloud-ethernet",
    "target_overlap": 0.9,
    "window": 20,
    "layers": [
        {"name": "encoder.weight", "shape": [512, 256], "numel": 131072, "dtype": "float32"},
        {"name": "encoder.bias", "shape": [512], "numel": 512, "dtype": "float32"},
        {"name": "head.weight", "shape": [10, 512], "numel": 5120, "dtype": "float32"},
    ],
}


def make_record(
    step: int,
    *,
    specs: dict[str, str] | None = None,
    changes: dict[str, tuple[str, str]] | None = None,
    guard_events: list[dict[str, Any]] | None = None,
    with_decision: bool = True,
    loss: float | None = 2.5,
) -> dict[str, Any]:
    """A record shaped like ``WindowRecord.to_dict()`` on rank 0."""
    specs = specs or {
        "encoder.weight": "powersgd:rank=4",
        "encoder.bias": "none",
        "head.weight": "fp16",
    }
    layers = [
        {
            "name": name,
            "spec": specs[name],
            "reason": f"{name}: {specs[name]} saves 3.1 ms vs fp16 (runner-up)",
            "rule": "too_small" if name.endswith("bias") else "knapsack",
            "predicted_seconds": 0.001 * (i + 1),
            "predicted_wire_bytes": 1000 * (i + 1),
            "predicted_error": 0.01 * i,
            "runner_up": None if name.endswith("bias") else "fp16",
            "runner_up_seconds": None if name.endswith("bias") else 0.004,
            "runner_up_error": None,
        }
        for i, name in enumerate(LAYERS)
    ]
    decision = {
        "step": step,
        "policy": "cloud-ethernet",
        "world_size": 4,
        "bandwidth_bytes_per_s": 1.25e8,
        "target_overlap": 0.9,
        "hideable_seconds": 0.05,
        "budget_seconds": None,
        "latency_seconds": 0.0002,
        "buckets": 1,
        "predicted_comm_seconds": 0.006,
        "predicted_exposed_seconds": 0.0,
        "predicted_overlap": 1.0,
        "predicted_error": 0.03,
        "predicted_wire_bytes": 6000,
        "feasible": True,
        "solver": "dp",
        "layers": layers,
    }
    return {
        "step": step,
        "bandwidth_bytes_per_s": 1.25e8 + step,
        "latency_s": 5e-5,
        "nic_bytes_per_s": 1.1e8,
        "step_seconds": 0.12,
        "backward_seconds": 0.06,
        "hideable_seconds": 0.05,
        "comm_busy_seconds": 0.02,
        "compress_seconds": 0.003,
        "exposed_seconds": 0.001,
        "measured_overlap": 0.95,
        "predicted_overlap": 0.97,
        "bytes_per_step": 6000.0,
        "uncompressed_bytes_per_step": 547_000.0,
        "loss": loss,
        "changes": changes or {},
        "decision": decision if with_decision else None,
        "guard_events": guard_events or [],
    }


def open_log(path: Path, **config: Any) -> RunLog:
    return RunLog.open(path, run_id="run-a", meta=META, config=RunLog.Config(**config))


def test_round_trip(tmp_path: Path) -> None:
    event = {
        "step": 40,
        "guard": "critical_regime",
        "layer": "head.weight",
        "detail": "grad norm 3.2x previous window",
        "action": "back off 1 level",
    }
    with open_log(tmp_path / "run") as log:
        log.append_window(make_record(20, loss=float("nan")))
        log.append_window(
            make_record(
                40,
                specs={
                    "encoder.weight": "powersgd:rank=8",
                    "encoder.bias": "none",
                    "head.weight": "none",
                },
                changes={
                    "encoder.weight": ("powersgd:rank=4", "powersgd:rank=8"),
                    "head.weight": ("fp16", "none"),
                },
                guard_events=[event],
            )
        )
        log.append_window(make_record(60, with_decision=False))  # a failed decision
        assert log.flush()
    assert log.written == 3 and log.dropped == 0

    with RunReader(tmp_path / "run") as reader:
        meta = reader.meta()
        assert meta["run_id"] == "run-a" and meta["schema_version"] == SCHEMA_VERSION
        assert meta["layers"] == META["layers"] and meta["policy"] == "cloud-ethernet"
        assert meta["hostname"] and meta["autocomp_version"]

        latest = reader.latest_window()
        assert latest is not None and latest["step"] == 60
        assert latest["record"]["decision"] is None

        windows = reader.windows()
        assert [w["step"] for w in windows] == [20, 40, 60]
        first = windows[0]
        assert first["loss"] is None and first["record"]["loss"] is None  # NaN -> null
        assert first["bandwidth_bytes_per_s"] == pytest.approx(1.25e8 + 20)
        assert first["measured_overlap"] == 0.95 and first["exposed_seconds"] == 0.001
        second = windows[1]
        assert second["n_changes"] == 2 and second["n_guard_events"] == 1
        assert second["record"]["changes"]["head.weight"] == ["fp16", "none"]
        assert second["record"]["decision"]["layers"][0]["spec"] == "powersgd:rank=8"
        assert [w["step"] for w in reader.windows(since_step=20, limit=1)] == [40]
        assert "record" not in reader.windows(with_record=False)[0]

        # Default: the latest window that has a decision (60 had none).
        table = reader.decisions()
        assert [d["name"] for d in table] == LAYERS and {d["step"] for d in table} == {40}
        assert table[0]["spec"] == "powersgd:rank=8" and table[0]["runner_up"] == "fp16"
        assert table[1]["rule"] == "too_small" and table[1]["runner_up"] is None
        assert table[2]["predicted_wire_bytes"] == 3000
        assert reader.decisions(20)[0]["spec"] == "powersgd:rank=4"
        assert reader.decisions(60) == []

        assert reader.changes() == [
            {
                "step": 40,
                "name": "encoder.weight",
                "old_spec": "powersgd:rank=4",
                "new_spec": "powersgd:rank=8",
            },
            {"step": 40, "name": "head.weight", "old_spec": "fp16", "new_spec": "none"},
        ]
        assert reader.changes(since_step=40) == []
        events = reader.guard_events()
        assert len(events) == 1 and {k: events[0][k] for k in event} == event
        assert reader.guard_counts() == {"critical_regime": 1}

        series = reader.series()
        assert series["step"] == [20, 40, 60]
        assert series["compression_ratio"] == [pytest.approx(547_000 / 6000)] * 3
        assert len(series["time"]) == 3 and series["measured_overlap"] == [0.95] * 3
        assert reader.check() == ["ok"]


def test_resume_same_run_and_refuse_other_run(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        for step in (20, 40, 60, 80):
            log.append_window(make_record(step))
    # Same run id: resumed. Logging step 40 again (restart from an earlier checkpoint) replaces
    # the abandoned timeline after it.
    with RunLog.open(tmp_path, run_id="run-a", meta={**META, "world_size": 8}) as log:
        log.append_window(make_record(40, specs={**dict.fromkeys(LAYERS, "none")}))
    with RunReader(tmp_path) as reader:
        assert [w["step"] for w in reader.windows()] == [20, 40]
        assert {d["spec"] for d in reader.decisions()} == {"none"}
        meta = reader.meta()
        assert meta["world_size"] == 8 and len(meta["resumed"]) == 1
    with pytest.raises(ValueError, match="belongs to run 'run-a'"):
        RunLog.open(tmp_path, run_id="run-b", meta=META)


def test_append_never_blocks_and_drops_oldest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = RunLog._write_batch

    def slow_write(self: RunLog, batch: list[Any], ops: list[Any]) -> None:
        time.sleep(0.2)  # a disk that has fallen far behind
        original(self, batch, ops)

    monkeypatch.setattr(RunLog, "_write_batch", slow_write)
    caplog.set_level(logging.WARNING, logger="autocomp.runlog")
    log = open_log(tmp_path, queue_size=4, batch_size=8)
    durations = []
    for i in range(1, 41):
        record = make_record(20 * i)
        start = time.perf_counter()
        log.append_window(record)
        durations.append(time.perf_counter() - start)
    log.close()
    # Every append returns immediately (a blocked one would take >= 200 ms); allow one
    # scheduler hiccup on a loaded machine.
    assert sorted(durations)[-2] < 0.005, durations
    assert max(durations) < 0.1
    assert log.dropped > 0 and log.dropped + log.written == 40
    drops = [r for r in caplog.records if "dropping oldest" in r.getMessage()]
    assert len(drops) == 1
    with RunReader(tmp_path) as reader:
        steps = [w["step"] for w in reader.windows()]
    # The newest records survive (the queue keeps the last 4); the dropped ones are older.
    assert steps[-4:] == [740, 760, 780, 800]
    assert len(steps) == log.written and steps == sorted(steps)


def test_retention_deletes_oldest_windows_and_their_rows(tmp_path: Path) -> None:
    with open_log(tmp_path, max_windows=10, batch_size=3) as log:
        for i in range(1, 26):
            changes = {"head.weight": ("fp16", "none")} if i % 2 else {}
            log.append_window(make_record(i, changes=changes))
    with RunReader(tmp_path) as reader:
        assert [w["step"] for w in reader.windows()] == list(range(16, 26))
        assert {c["step"] for c in reader.changes()} == {17, 19, 21, 23, 25}
    conn = sqlite3.connect(tmp_path / "run.db")
    assert conn.execute("SELECT min(step), count(*) FROM layer_decisions").fetchone() == (16, 30)
    conn.close()


def test_reader_sees_consistent_snapshots_during_writes(tmp_path: Path) -> None:
    log = open_log(tmp_path, queue_size=1000)
    log.append_window(make_record(0))
    assert log.flush()
    reader = RunReader(tmp_path)
    stop = threading.Event()
    problems: list[str] = []
    polls = [0]

    def poll() -> None:
        last = -1
        while not stop.is_set():
            with reader.snapshot():
                latest = reader.latest_window()
                assert latest is not None
                step = latest["step"]
                table = reader.decisions(step)
                changes = [c for c in reader.changes(since_step=step - 1) if c["step"] == step]
            if step < last:
                problems.append(f"step went back {last} -> {step}")
            if [d["name"] for d in table] != LAYERS:
                problems.append(f"step {step}: decisions {table}")
            if len(changes) != latest["n_changes"]:
                problems.append(f"step {step}: {len(changes)} changes, {latest['n_changes']}")
            last = step
            polls[0] += 1

    thread = threading.Thread(target=poll)
    thread.start()
    override_id = None
    try:
        for i in range(1, 501):
            changes = {"encoder.weight": ("none", "fp16")} if i % 3 == 0 else {}
            log.append_window(make_record(i, changes=changes))
            if i == 250:  # another process's write while the writer is busy
                override_id = RunReader(tmp_path).add_override("freeze", who="test")
            if i % 50 == 0:
                time.sleep(0.01)
        assert log.flush(timeout=20)
    finally:
        stop.set()
        thread.join()
    log.close()
    assert problems == []
    assert polls[0] > 5
    assert log.dropped == 0 and log.written == 501
    assert reader.latest_window()["step"] == 500  # type: ignore[index]
    assert [o["id"] for o in reader.overrides()] == [override_id]
    reader.close()


_KILLED_WRITER = """
import importlib.util, os, sys, time
# The package alone, without autocomp/__init__ (which imports torch): a fast start, and proof
# that the run log imports nothing from autocomp but itself.
spec = importlib.util.spec_from_file_location(
    "runlog_standalone", sys.argv[1], submodule_search_locations=[os.path.dirname(sys.argv[1])]
)
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
assert "torch" not in sys.modules
record = eval(sys.argv[3])
log = module.RunLog.open(sys.argv[2], run_id="killed", meta={"world_size": 2})
step = 0
while True:
    for _ in range(10):
        step += 1
        log.append_window({**record, "step": step})
    log.flush()
    print(f"committed {step}", flush=True)
"""


def test_sigkill_leaves_readable_db(tmp_path: Path) -> None:
    record = make_record(0, changes={"head.weight": ("fp16", "none")})
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, runlog.__file__, str(tmp_path), repr(record)],
        stdout=subprocess.PIPE,
        text=True,
    )
    committed = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            committed = int(line.split()[1])
            if committed >= 200:
                break
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: it keeps appending
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert committed >= 200
    with RunReader(tmp_path) as reader:
        windows = reader.windows(limit=100_000, with_record=False)
        steps = [w["step"] for w in windows]
        assert steps[:committed] == list(range(1, committed + 1))
        assert steps == list(range(1, len(steps) + 1))
        latest = reader.latest_window()
        assert latest is not None and latest["record"]["changes"] == {
            "head.weight": ["fp16", "none"]
        }
        assert len(reader.decisions(latest["step"])) == len(LAYERS)
        assert reader.meta()["run_id"] == "killed"
        assert reader.check() == ["ok"]


def _make_closed_log(path: Path, windows: int = 5) -> Path:
    with open_log(path) as log:
        for i in range(1, windows + 1):
            log.append_window(make_record(20 * i))
    db = path / "run.db"
    # Checkpoint and drop the WAL, as the last writer to close does.
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db


def test_missing_foreign_and_broken_files_raise_runlog_error(tmp_path: Path) -> None:
    with pytest.raises(RunLogError, match="no such run directory"):
        RunReader(tmp_path / "nope")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(RunLogError, match=r"no run\.db"):
        RunReader(tmp_path / "empty_dir")

    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('x')")
    conn.commit()
    conn.close()
    with pytest.raises(RunLogError, match="foreign SQLite database"):
        RunReader(foreign)
    # The writer refuses it too, naming the path, and leaves it alone.
    (tmp_path / "foreign_run").mkdir()
    (tmp_path / "foreign_run" / "run.db").write_bytes(foreign.read_bytes())
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "foreign_run" / "run.db"))):
        open_log(tmp_path / "foreign_run")
    conn = sqlite3.connect(tmp_path / "foreign_run" / "run.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()

    random_bytes = tmp_path / "random.db"
    random_bytes.write_bytes(os.urandom(8192))
    with pytest.raises(RunLogError, match="not an SQLite database"):
        RunReader(random_bytes)
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(RunLogError, match="empty file"):
        RunReader(empty)

    good = _make_closed_log(tmp_path / "good", windows=200)
    data = good.read_bytes()
    page = int.from_bytes(data[16:18], "big")

    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(data[:page] + os.urandom(len(data) - page))
    with pytest.raises(RunLogError, match="corrupt"):
        reader = RunReader(corrupt)
        reader.windows(limit=100_000)
        reader.decisions()

    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(RunLogError, match="truncated"):
        RunReader(truncated)
    stub = tmp_path / "stub.db"
    stub.write_bytes(data[:50])
    with pytest.raises(RunLogError, match="truncated"):
        RunReader(stub)


@pytest.mark.parametrize(("version", "word"), [(SCHEMA_VERSION + 1, "newer"), (0, "older")])
def test_other_schema_version_is_refused(tmp_path: Path, version: int, word: str) -> None:
    db = _make_closed_log(tmp_path)
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
    conn.commit()
    conn.close()
    with pytest.raises(RunLogError, match=f"schema version {version}.*{word}"):
        RunReader(tmp_path)
    with pytest.raises(ValueError, match=f"schema version {version}"):
        open_log(tmp_path)


def test_overrides_add_pending_mark_applied(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    reader = RunReader(tmp_path)
    assert log.pending_overrides() == []
    pin = reader.add_override("pin", glob="head.*", spec="topk:ratio=0.01", who="alice")
    force = reader.add_override("force_none", who="pager")
    pending = log.pending_overrides()
    assert [(o.id, o.kind, o.glob, o.spec, o.who) for o in pending] == [
        (pin, "pin", "head.*", "topk:ratio=0.01", "alice"),
        (force, "force_none", None, None, "pager"),
    ]
    assert pending[0].status == "pending" and pending[0].applied_step is None

    log.mark_overrides_applied([pin], step=120)
    log.mark_overrides_applied([force], step=120, status="rejected: frozen")
    assert log.pending_overrides() == []  # hidden at once, before the writer commits
    assert log.flush()
    assert log.pending_overrides() == []
    rows = {o["id"]: o for o in reader.overrides()}
    assert rows[pin]["applied_step"] == 120 and rows[pin]["status"] == "applied"
    assert rows[force]["status"] == "rejected: frozen"
    assert [o["id"] for o in reader.overrides()] == [force, pin]  # newest first

    later = reader.add_override("unpin", glob="head.*", who="alice")
    assert [o.id for o in log.pending_overrides()] == [later] and later > force
    for kind, kwargs in [
        ("bogus", {}),
        ("pin", {"glob": "head.*"}),
        ("unpin", {}),
        ("freeze", {"glob": "*"}),
        ("unfreeze", {"spec": "fp16"}),
    ]:
        with pytest.raises(ValueError):
            reader.add_override(kind, who="x", **kwargs)
    log.close()
    log.close()  # idempotent
    assert log.pending_overrides() == []
    reader.close()


def test_run_ids_and_dirs() -> None:
    first = new_run_id()
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", first)
    assert new_run_id() != first
    assert default_run_dir(first) == Path("autocomp-runs") / first
    with pytest.raises(ValueError):
        default_run_dir("../x")


def test_malformed_record_is_skipped_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="autocomp.runlog")
    with open_log(tmp_path, batch_size=8) as log:
        log.append_window(make_record(20))
        log.append_window({"loss": 1.0})  # no step: cannot be stored
        log.append_window(make_record(40))
    assert log.written == 2 and log.write_errors == 1
    assert any("malformed" in r.getMessage() for r in caplog.records)
    with RunReader(tmp_path) as reader:
        assert [w["step"] for w in reader.windows()] == [20, 40]
