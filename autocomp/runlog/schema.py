"""The run log's SQLite schema, its version checks, and the connection helpers every side uses.

One place defines what a run log *is* (tables, column lists, ``application_id``, schema
version), so the writer, the reader and the override queue cannot disagree about it, and so a
file that is anything else -- a foreign SQLite file, another schema version, a corrupt or
truncated file -- is refused the same way by all of them (:class:`RunLogError`).

No torch here, nor anything else from autocomp: readers (the sidecar) stay light.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
"""Version of the tables below; readers refuse any other (no silent misreads)."""
APPLICATION_ID = 0x6163726C  # "acrl": autocomp run log
"""``PRAGMA application_id`` of every run log (``file(1)`` and readers can tell it apart)."""
FORMAT = "autocomp-runlog"
"""Value of the ``format`` meta key."""
DB_NAME = "run.db"
"""File name of the database inside a run directory."""
RUNS_DIR = "autocomp-runs"
"""Parent directory of run directories (relative to the working directory)."""
OVERRIDE_KINDS = ("pin", "unpin", "force_none", "unforce", "freeze", "unfreeze")
"""What an operator can ask of a running job (see :class:`~autocomp.runlog.Override`)."""

SQLITE_MAGIC = b"SQLite format 3\x00"
RESERVED_META = ("format", "schema_version", "run_id", "created")
"""Meta keys the log owns; a caller's values for them are ignored."""

SCHEMA = f"""
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL  -- JSON
);
CREATE TABLE windows (
    step INTEGER PRIMARY KEY,  -- step at which the window's plan takes effect
    time REAL NOT NULL,        -- wall clock (unix seconds) when the trainer logged it
    bandwidth_bytes_per_s REAL,
    latency_s REAL,
    nic_bytes_per_s REAL,
    step_seconds REAL,
    backward_seconds REAL,
    hideable_seconds REAL,
    comm_busy_seconds REAL,
    compress_seconds REAL,
    exposed_seconds REAL,
    measured_overlap REAL,
    predicted_overlap REAL,
    bytes_per_step REAL,
    uncompressed_bytes_per_step REAL,
    loss REAL,
    n_changes INTEGER NOT NULL DEFAULT 0,
    n_guard_events INTEGER NOT NULL DEFAULT 0,
    record TEXT NOT NULL       -- the full WindowRecord.to_dict() as JSON
);
CREATE TABLE layer_decisions (
    id INTEGER PRIMARY KEY,
    step INTEGER NOT NULL,
    idx INTEGER NOT NULL,      -- position in the decision (model order)
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    reason TEXT,
    rule TEXT,
    predicted_seconds REAL,
    predicted_wire_bytes INTEGER,
    predicted_error REAL,
    runner_up TEXT,
    runner_up_seconds REAL,
    runner_up_error REAL
);
CREATE UNIQUE INDEX layer_decisions_step ON layer_decisions (step, idx);
CREATE TABLE changes (
    id INTEGER PRIMARY KEY,
    step INTEGER NOT NULL,
    name TEXT NOT NULL,
    old_spec TEXT NOT NULL,
    new_spec TEXT NOT NULL
);
CREATE INDEX changes_step ON changes (step);
CREATE INDEX changes_name ON changes (name, step);
CREATE TABLE guard_events (
    id INTEGER PRIMARY KEY,
    step INTEGER NOT NULL,
    guard TEXT NOT NULL,
    layer TEXT,
    detail TEXT NOT NULL,
    action TEXT NOT NULL
);
CREATE INDEX guard_events_step ON guard_events (step);
CREATE TABLE overrides (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: the controller acknowledges by id
    created REAL NOT NULL,
    who TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ({", ".join(repr(k) for k in OVERRIDE_KINDS)})),
    glob TEXT,
    spec TEXT,
    applied_step INTEGER,      -- NULL while pending
    applied_time REAL,
    status TEXT NOT NULL DEFAULT 'pending'
);
CREATE INDEX overrides_pending ON overrides (id) WHERE applied_step IS NULL;
"""

WINDOW_COLUMNS = (
    "bandwidth_bytes_per_s",
    "latency_s",
    "nic_bytes_per_s",
    "step_seconds",
    "backward_seconds",
    "hideable_seconds",
    "comm_busy_seconds",
    "compress_seconds",
    "exposed_seconds",
    "measured_overlap",
    "predicted_overlap",
    "bytes_per_step",
    "uncompressed_bytes_per_step",
    "loss",
)
"""The record's numbers copied into flat ``windows`` columns (for charts and SQL)."""
FLAT_COLUMNS = ("step", "time", *WINDOW_COLUMNS, "n_changes", "n_guard_events")
"""Every ``windows`` column but ``record``, in table order."""
DECISION_COLUMNS = (
    "step",
    "idx",
    "name",
    "spec",
    "reason",
    "rule",
    "predicted_seconds",
    "predicted_wire_bytes",
    "predicted_error",
    "runner_up",
    "runner_up_seconds",
    "runner_up_error",
)
"""``layer_decisions`` columns but ``id``."""
OVERRIDE_COLUMNS = (
    "id",
    "created",
    "who",
    "kind",
    "glob",
    "spec",
    "applied_step",
    "applied_time",
    "status",
)
"""``overrides`` columns, in the order of :class:`~autocomp.runlog.Override`'s fields."""


class RunLogError(ValueError):
    """The path is not a readable autocomp run log of this schema version (message says why)."""


# ---- connections ----------------------------------------------------------------------------


def connect(
    target: str, *, uri: bool = False, timeout: float = 5.0, check_same_thread: bool = True
) -> sqlite3.Connection:
    """A connection without implicit transactions: every transaction here is explicit."""
    conn = sqlite3.connect(
        target,
        uri=uri,
        timeout=timeout,
        isolation_level=None,
        check_same_thread=check_same_thread,
    )
    conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    return conn


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection, mode: str = "") -> Iterator[sqlite3.Connection]:
    """``BEGIN [mode]`` ... ``COMMIT``, rolled back on any exception."""
    conn.execute(f"BEGIN {mode}")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:  # SQLite may already have rolled back (e.g. disk full)
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# ---- creating and checking ------------------------------------------------------------------


def db_path(path: Path) -> Path:
    """The database file of a run directory (or ``path`` itself when it is the file)."""
    return path / DB_NAME if path.is_dir() else path


def check_file(db: Path, *, allow_empty: bool) -> None:
    """Header checks SQLite itself does late or not at all (truncation, not-a-database)."""
    size = db.stat().st_size
    if size == 0:
        if allow_empty:
            return
        raise RunLogError(f"{db}: empty file (0 bytes), not an autocomp run log")
    with db.open("rb") as handle:
        header = handle.read(100)
    if len(header) < len(SQLITE_MAGIC):
        if SQLITE_MAGIC.startswith(header):
            raise RunLogError(f"{db}: truncated SQLite file ({size} bytes)")
        raise RunLogError(f"{db}: not an SQLite database (not an autocomp run log)")
    if not header.startswith(SQLITE_MAGIC):
        raise RunLogError(f"{db}: not an SQLite database (not an autocomp run log)")
    if len(header) < 100:
        raise RunLogError(f"{db}: truncated SQLite file ({size} bytes, header incomplete)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The in-header size is trustworthy only when "version-valid-for" equals the change counter;
    # with a non-empty WAL next to it, the WAL may hold the pages (SQLite sorts that out).
    wal = db.with_name(db.name + "-wal")
    wal_pending = wal.exists() and wal.stat().st_size > 0
    header_valid = header[24:28] == header[92:96] and pages > 0
    if header_valid and not wal_pending and size < pages * page_size:
        raise RunLogError(
            f"{db}: truncated SQLite file ({size} bytes, header says "
            f"{pages} pages of {page_size} bytes)"
        )


def tables(conn: sqlite3.Connection) -> set[str]:
    """Names of the tables in the database (empty for a new file)."""
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {row[0] for row in rows}


def read_meta(conn: sqlite3.Connection) -> dict[str, Any]:
    """The ``meta`` table, JSON-decoded."""
    return {key: json.loads(value) for key, value in conn.execute("SELECT key, value FROM meta")}


def create(conn: sqlite3.Connection) -> None:
    """Create the tables and stamp the file (inside the caller's transaction)."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def check_runlog(conn: sqlite3.Connection, db: Path) -> dict[str, Any]:
    """Raise RunLogError unless ``conn`` is an autocomp run log of this schema; return meta."""
    found_tables = tables(conn)
    application_id = conn.execute("PRAGMA application_id").fetchone()[0]
    if "meta" not in found_tables or application_id != APPLICATION_ID:
        what = "an empty SQLite database" if not found_tables else "a foreign SQLite database"
        raise RunLogError(f"{db}: {what}, not an autocomp run log")
    try:
        meta = read_meta(conn)
    except (ValueError, TypeError) as err:  # bad JSON in meta
        raise RunLogError(f"{db}: corrupt autocomp run log (meta: {err})") from None
    if meta.get("format") != FORMAT:
        raise RunLogError(f"{db}: a foreign SQLite database, not an autocomp run log")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version != SCHEMA_VERSION or meta.get("schema_version") != SCHEMA_VERSION:
        found = version if version != SCHEMA_VERSION else meta.get("schema_version")
        if isinstance(found, int) and found > SCHEMA_VERSION:
            hint = "written by a newer autocomp; upgrade autocomp to read it"
        else:
            hint = "written by an older autocomp; read it with that version"
        raise RunLogError(
            f"{db}: run log schema version {found}, this autocomp reads version "
            f"{SCHEMA_VERSION} ({hint})"
        )
    return meta
