"""Persistent run log: one SQLite database per run, written on rank 0, read by other processes.

The adaptive controller keeps only the last few window records in memory; the run log keeps the
whole run on disk so that a sidecar (dashboard, metrics exporter) and ``autocomp-advisor report``
can show it live or after the fact, and so that an operator can send overrides (pin a layer,
force everything uncompressed, freeze the plan) to a running job without touching its code.

Layout: ``./autocomp-runs/<run-id>/run.db`` by default (:func:`default_run_dir`).

Why SQLite in WAL mode: readers in other processes get a consistent snapshot per read
transaction without ever blocking the writer, every committed transaction survives a crash of
the trainer (``kill -9``, OOM), and there is nothing to run or install. ``synchronous=NORMAL``
skips the fsync per commit: a power loss may lose the last few windows, never corrupt the file.

Two sides:

* :class:`RunLog` (rank 0 of the trainer). :meth:`RunLog.append_window` only puts the record on
  a bounded in-memory queue; a daemon thread serializes it and writes it in a transaction, so
  the training thread never waits for the disk. When the disk falls behind, the oldest queued
  record is dropped (and counted) rather than slowing training down.
* :class:`RunReader` (any process). Read-only connection for the queries, plus
  :meth:`RunReader.add_override`, which opens a short write connection.

The schema is versioned (:data:`SCHEMA_VERSION`, in ``PRAGMA user_version`` and in the ``meta``
table; ``PRAGMA application_id`` marks the file as an autocomp run log). Opening anything else --
a foreign SQLite file, another schema version, a corrupt or truncated file -- raises
:class:`RunLogError` with the path and what is wrong.

This module imports neither torch nor the rest of autocomp, so that readers stay light.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import math
import secrets
import socket
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

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
"""What an operator can ask of a running job (see :class:`Override`)."""

_SQLITE_MAGIC = b"SQLite format 3\x00"
_RESERVED_META = ("format", "schema_version", "run_id", "created")

_SCHEMA = f"""
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

_WINDOW_COLUMNS = (
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
_FLAT_COLUMNS = ("step", "time", *_WINDOW_COLUMNS, "n_changes", "n_guard_events")
_DECISION_COLUMNS = (
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
_OVERRIDE_COLUMNS = (
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


class RunLogError(ValueError):
    """The path is not a readable autocomp run log of this schema version (message says why)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Override:
    """One operator request, as stored in the ``overrides`` table.

    Kinds: ``pin`` (layers matching ``glob`` use ``spec``), ``unpin`` (drop the operator pin on
    ``glob``), ``force_none`` / ``unforce`` (every layer uncompressed, or back to the policy),
    ``freeze`` / ``unfreeze`` (keep the current plan, or decide again).
    """

    id: int
    """Row id, increasing; the controller acknowledges overrides by id."""
    created: float
    """Wall clock (unix seconds) when it was requested."""
    who: str
    """Who asked (user, tool), for the audit trail."""
    kind: str
    """One of :data:`OVERRIDE_KINDS`."""
    glob: str | None
    """Parameter-name glob (``pin`` and ``unpin``)."""
    spec: str | None
    """Compressor spec (``pin``)."""
    applied_step: int | None
    """Step at which the controller applied it (None while pending)."""
    applied_time: float | None
    """Wall clock when the writer recorded the application."""
    status: str
    """``pending``, ``applied``, or the controller's reason for rejecting it."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def new_run_id() -> str:
    """A run id that sorts by start time (UTC) and is unique without coordination."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def default_run_dir(run_id: str) -> Path:
    """``./autocomp-runs/<run_id>``: next to where the job runs, where people look first."""
    if not run_id or "/" in run_id or "\\" in run_id or run_id in (".", ".."):
        raise ValueError(f"run_id must be a plain directory name, got {run_id!r}")
    return Path(RUNS_DIR) / run_id


def _autocomp_version() -> str:
    # importlib.metadata rather than `import autocomp`: the package imports torch.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("autocomp")
    except PackageNotFoundError:
        return "unknown"


# ---- value conversion -----------------------------------------------------------------------


def _num(value: Any) -> float | None:
    """A finite float, or None (NaN/inf are not valid JSON and SQLite turns NaN into NULL)."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _jsonable(value: Any) -> Any:
    """Strict-JSON-safe copy: non-finite floats -> None, tuples -> lists, keys -> str."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    return json.dumps(_jsonable(value), allow_nan=False, default=str, separators=(",", ":"))


@dataclass(slots=True)
class _Rows:
    """One window record turned into table rows (done before the transaction, so a malformed
    record is skipped alone instead of failing the whole batch)."""

    step: int
    window: tuple[Any, ...]
    decisions: list[tuple[Any, ...]]
    changes: list[tuple[Any, ...]]
    guards: list[tuple[Any, ...]]


def _rows(wall: float, record: Mapping[str, Any]) -> _Rows:
    step = int(record["step"])
    decision = record.get("decision") or {}
    decisions = []
    for idx, layer in enumerate(decision.get("layers") or ()):
        wire = layer.get("predicted_wire_bytes")
        decisions.append(
            (
                step,
                idx,
                str(layer["name"]),
                str(layer["spec"]),
                layer.get("reason"),
                layer.get("rule"),
                _num(layer.get("predicted_seconds")),
                None if wire is None else int(wire),
                _num(layer.get("predicted_error")),
                layer.get("runner_up"),
                _num(layer.get("runner_up_seconds")),
                _num(layer.get("runner_up_error")),
            )
        )
    changes = [
        (step, str(name), str(old), str(new))
        for name, (old, new) in sorted((record.get("changes") or {}).items())
    ]
    guards = [
        (
            int(event.get("step", step)),
            str(event["guard"]),
            event.get("layer"),
            str(event.get("detail", "")),
            str(event.get("action", "")),
        )
        for event in record.get("guard_events") or ()
    ]
    window = (
        step,
        wall,
        *(_num(record.get(column)) for column in _WINDOW_COLUMNS),
        len(changes),
        len(guards),
        _dumps(record),
    )
    return _Rows(step=step, window=window, decisions=decisions, changes=changes, guards=guards)


# ---- opening and checking -------------------------------------------------------------------


def _db_path(path: Path) -> Path:
    return path / DB_NAME if path.is_dir() else path


def _check_file(db: Path, *, allow_empty: bool) -> None:
    """Header checks SQLite itself does late or not at all (truncation, not-a-database)."""
    size = db.stat().st_size
    if size == 0:
        if allow_empty:
            return
        raise RunLogError(f"{db}: empty file (0 bytes), not an autocomp run log")
    with db.open("rb") as handle:
        header = handle.read(100)
    if len(header) < len(_SQLITE_MAGIC):
        if _SQLITE_MAGIC.startswith(header):
            raise RunLogError(f"{db}: truncated SQLite file ({size} bytes)")
        raise RunLogError(f"{db}: not an SQLite database (not an autocomp run log)")
    if not header.startswith(_SQLITE_MAGIC):
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


def _tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {row[0] for row in rows}


def _read_meta(conn: sqlite3.Connection) -> dict[str, Any]:
    return {key: json.loads(value) for key, value in conn.execute("SELECT key, value FROM meta")}


def _check_runlog(conn: sqlite3.Connection, db: Path) -> dict[str, Any]:
    """Raise RunLogError unless ``conn`` is an autocomp run log of this schema; return meta."""
    tables = _tables(conn)
    application_id = conn.execute("PRAGMA application_id").fetchone()[0]
    if "meta" not in tables or application_id != APPLICATION_ID:
        what = "an empty SQLite database" if not tables else "a foreign SQLite database"
        raise RunLogError(f"{db}: {what}, not an autocomp run log")
    try:
        meta = _read_meta(conn)
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


def _connect(
    target: str, *, uri: bool = False, timeout: float = 5.0, check_same_thread: bool = True
) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; every transaction here is explicit.
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
def _transaction(conn: sqlite3.Connection, mode: str = "") -> Iterator[sqlite3.Connection]:
    conn.execute(f"BEGIN {mode}")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:  # SQLite may already have rolled back (e.g. disk full)
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# ---- writer ---------------------------------------------------------------------------------


class RunLog:
    """The trainer side (rank 0): windows go to disk on a daemon thread, overrides come back.

    Create with :meth:`open`. Thread model: ``append_window``, ``pending_overrides`` and
    ``mark_overrides_applied`` are called from the training thread and never touch the disk
    for writing; all writes happen on the writer thread, one connection, in transactions.
    ``mark_overrides_applied`` is queued to that thread too (never dropped), so it cannot
    interleave with a window write; ``pending_overrides`` hides ids already marked but not yet
    written, so an override is never handed out twice.
    """

    @dataclass(kw_only=True, slots=True)
    class Config:
        """Writer settings."""

        queue_size: int = 256
        """Window records waiting for the writer thread; when full the oldest is dropped."""
        batch_size: int = 64
        """Most records written in one transaction (a slow disk catches up in big commits)."""
        max_windows: int = 50_000
        """Windows kept; older ones are deleted with their layer decisions and changes."""
        max_guard_events: int = 100_000
        """Guard events kept (oldest deleted first); they outlive their windows otherwise."""
        busy_timeout_s: float = 5.0
        """How long a write waits for another process's lock (e.g. a sidecar's override)."""

    @staticmethod
    def validate(config: Config) -> None:
        """Raise ValueError for settings the writer cannot work with."""
        if config.queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {config.queue_size}")
        if config.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {config.batch_size}")
        if config.max_windows < 1:
            raise ValueError(f"max_windows must be >= 1, got {config.max_windows}")
        if config.max_guard_events < 1:
            raise ValueError(f"max_guard_events must be >= 1, got {config.max_guard_events}")
        if config.busy_timeout_s < 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {config.busy_timeout_s}")

    def __init__(
        self,
        db_path: Path,
        run_id: str,
        config: Config,
        writer: sqlite3.Connection,
        reader: sqlite3.Connection,
    ) -> None:
        """Use :meth:`open`; this only wires up already-checked connections."""
        self.path = db_path
        """The database file."""
        self.run_id = run_id
        self.config = config
        self.dropped = 0
        """Window records dropped because the queue was full (the disk fell behind)."""
        self.written = 0
        """Window records committed."""
        self.write_errors = 0
        """Batches or records that failed to write (see the log)."""
        self._writer = writer
        self._reader = reader
        self._read_lock = threading.Lock()
        self._cond = threading.Condition()
        self._records: deque[tuple[float, Mapping[str, Any]]] = deque()
        self._ops: deque[tuple[list[int], int, str]] = deque()
        self._marked: set[int] = set()
        self._busy = False
        self._stopping = False
        self._closed = False
        self._warned_drop = False
        self._last_step, self._count = writer.execute(
            "SELECT coalesce(max(step), -1), count(*) FROM windows"
        ).fetchone()
        self._thread = threading.Thread(
            target=self._run, name=f"autocomp-runlog-{run_id}", daemon=True
        )
        self._thread.start()
        atexit.register(self.close)

    @classmethod
    def open(
        cls,
        run_dir: Path | str,
        *,
        run_id: str,
        meta: Mapping[str, Any],
        config: Config | None = None,
    ) -> RunLog:
        """Create (or resume) the run log in ``run_dir`` and start the writer thread.

        ``meta`` is stored as JSON per key (world_size, policy, target_overlap, window, layers
        as ``[{name, shape, numel, dtype}]``, ...); ``hostname`` and ``autocomp_version`` are
        filled in when absent; ``format``, ``schema_version``, ``run_id`` and ``created`` are
        the log's own. An existing log of the same ``run_id`` is resumed: its meta is updated
        and a resume time appended to ``resumed``; windows logged again (a restart from an
        earlier checkpoint) replace the later ones of the abandoned timeline.

        Raises:
            ValueError: the database exists but is not an autocomp run log of this schema
                version (:class:`RunLogError`), or belongs to another run.
        """
        config = config or cls.Config()
        cls.validate(config)
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        db = run_dir / DB_NAME
        if db.exists():
            _check_file(db, allow_empty=True)
        timeout = config.busy_timeout_s
        writer = _connect(str(db), timeout=timeout, check_same_thread=False)
        try:
            cls._prepare(writer, db, run_id, meta)
            reader = _connect(str(db), timeout=timeout, check_same_thread=False)
        except sqlite3.DatabaseError as err:
            writer.close()
            raise RunLogError(f"{db}: cannot open as an autocomp run log: {err}") from None
        except BaseException:
            writer.close()
            raise
        logger.info("autocomp run log: %s (run %s)", db, run_id)
        return cls(db, run_id, config, writer, reader)

    @staticmethod
    def _prepare(conn: sqlite3.Connection, db: Path, run_id: str, meta: Mapping[str, Any]) -> None:
        """Check an existing database (before changing anything), or create the schema."""
        if _tables(conn):
            _check_runlog(conn, db)
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            logger.warning("autocomp run log %s: journal_mode is %s, not WAL", db, mode)
        conn.execute("PRAGMA synchronous = NORMAL")
        now = time.time()
        with _transaction(conn, "IMMEDIATE"):
            if _tables(conn):  # re-check under the lock: another process may have created it
                stored = _check_runlog(conn, db)
                if stored.get("run_id") != run_id:
                    raise ValueError(
                        f"{db}: belongs to run {stored.get('run_id')!r}, not {run_id!r}; "
                        "use a new run directory"
                    )
                values = {k: v for k, v in meta.items() if k not in _RESERVED_META}
                values["resumed"] = [*stored.get("resumed", []), now]
            else:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                values = {
                    "hostname": socket.gethostname(),
                    "autocomp_version": _autocomp_version(),
                    **{k: v for k, v in meta.items() if k not in _RESERVED_META},
                    "format": FORMAT,
                    "schema_version": SCHEMA_VERSION,
                    "run_id": run_id,
                    "created": now,
                }
            conn.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [(key, _dumps(value)) for key, value in values.items()],
            )

    # ---- training-thread side -----------------------------------------------------------------

    def append_window(self, record: Mapping[str, Any]) -> None:
        """Queue one ``WindowRecord.to_dict()`` for writing; returns at once, never raises.

        The record is serialized later on the writer thread: do not mutate it afterwards.
        """
        wall = time.time()
        with self._cond:
            if self._stopping:
                self.dropped += 1
                return
            if len(self._records) >= self.config.queue_size:
                self._records.popleft()
                self.dropped += 1
                if not self._warned_drop:
                    self._warned_drop = True
                    logger.warning(
                        "autocomp run log %s: writer behind, dropping oldest queued windows "
                        "(queue_size=%d; see RunLog.dropped)",
                        self.path,
                        self.config.queue_size,
                    )
            self._records.append((wall, record))
            self._cond.notify()

    def pending_overrides(self) -> list[Override]:
        """Overrides not yet applied, oldest first (one indexed read; empty on a read error)."""
        with self._read_lock:
            if self._closed:
                return []
            try:
                rows = self._reader.execute(
                    f"SELECT {', '.join(_OVERRIDE_COLUMNS)} FROM overrides "
                    "WHERE applied_step IS NULL ORDER BY id"
                ).fetchall()
            except sqlite3.Error:
                logger.warning(
                    "autocomp run log %s: cannot read overrides", self.path, exc_info=True
                )
                return []
            return [
                Override(**dict(zip(_OVERRIDE_COLUMNS, row, strict=True)))
                for row in rows
                if row[0] not in self._marked
            ]

    def mark_overrides_applied(
        self, ids: Sequence[int], step: int, status: str = "applied"
    ) -> None:
        """Record that the controller applied (or, with another ``status``, rejected) ``ids``.

        Queued to the writer thread (never dropped); :meth:`pending_overrides` stops returning
        these ids immediately.
        """
        ids = [int(i) for i in ids]
        if not ids:
            return
        with self._read_lock:
            self._marked.update(ids)
        with self._cond:
            if self._stopping:
                logger.warning(
                    "autocomp run log %s: closed, overrides %s not marked", self.path, ids
                )
                return
            self._ops.append((ids, int(step), str(status)))
            self._cond.notify()

    def flush(self, timeout: float | None = 5.0) -> bool:
        """Wait until everything queued so far is committed; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._records or self._ops or self._busy:
                if not self._thread.is_alive():
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (up to ``timeout``), stop the thread. Idempotent; also atexit."""
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            self._cond.notify_all()
        atexit.unregister(self.close)
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning(
                "autocomp run log %s: writer did not finish within %.1f s; %d windows unwritten",
                self.path,
                timeout,
                len(self._records),
            )
        with self._read_lock:
            self._closed = True
            self._reader.close()
        if self.dropped:
            logger.warning("autocomp run log %s: %d windows dropped", self.path, self.dropped)

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunLog({str(self.path)!r}, run_id={self.run_id!r}, written={self.written})"

    # ---- writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._records or self._ops or self._stopping):
                        self._cond.wait()
                    if not (self._records or self._ops):
                        return  # stopping and drained
                    count = min(len(self._records), self.config.batch_size)
                    batch = [self._records.popleft() for _ in range(count)]
                    ops = list(self._ops)
                    self._ops.clear()
                    self._busy = True
                try:
                    self._write_batch(batch, ops)
                except Exception:
                    self.write_errors += 1
                    logger.exception(
                        "autocomp run log %s: failed to write %d windows", self.path, len(batch)
                    )
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
        finally:
            self._writer.close()

    def _write_batch(
        self, batch: list[tuple[float, Mapping[str, Any]]], ops: list[tuple[list[int], int, str]]
    ) -> None:
        """One transaction: the batch's windows, retention, and override acknowledgements."""
        rows = []
        for wall, record in batch:
            try:
                rows.append(_rows(wall, record))
            except Exception:
                self.write_errors += 1
                logger.exception("autocomp run log %s: malformed window record skipped", self.path)
        conn = self._writer
        saved = (self._last_step, self._count)
        try:
            with _transaction(conn, "IMMEDIATE"):
                for item in rows:
                    self._insert(conn, item)
                self._retain(conn)
                now = time.time()
                for ids, step, status in ops:
                    conn.executemany(
                        "UPDATE overrides SET applied_step = ?, applied_time = ?, status = ? "
                        "WHERE id = ?",
                        [(step, now, status, i) for i in ids],
                    )
        except BaseException:
            # Rolled back: the counters must describe the table again. The batch is lost
            # (logged by the caller); marked overrides stay hidden from pending_overrides in
            # this process, and show as pending again only after a restart.
            self._last_step, self._count = saved
            raise
        self.written += len(rows)
        if ops:
            with self._read_lock:  # after the commit: the rows now say applied
                for ids, _, _ in ops:
                    self._marked.difference_update(ids)

    def _insert(self, conn: sqlite3.Connection, rows: _Rows) -> None:
        if rows.step <= self._last_step:
            # Logged again: a restart from an earlier checkpoint. The later windows belong to the
            # abandoned timeline; keep the table a single increasing history.
            deleted = self._delete_from(conn, rows.step)
            logger.info(
                "autocomp run log %s: step %d logged again (resumed?); %d later windows replaced",
                self.path,
                rows.step,
                deleted,
            )
        conn.execute(
            f"INSERT INTO windows ({', '.join(_FLAT_COLUMNS)}, record) "
            f"VALUES ({', '.join('?' * (len(_FLAT_COLUMNS) + 1))})",
            rows.window,
        )
        conn.executemany(
            f"INSERT INTO layer_decisions ({', '.join(_DECISION_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(_DECISION_COLUMNS))})",
            rows.decisions,
        )
        conn.executemany(
            "INSERT INTO changes (step, name, old_spec, new_spec) VALUES (?, ?, ?, ?)",
            rows.changes,
        )
        conn.executemany(
            "INSERT INTO guard_events (step, guard, layer, detail, action) VALUES (?, ?, ?, ?, ?)",
            rows.guards,
        )
        self._last_step = rows.step
        self._count += 1

    def _delete_from(self, conn: sqlite3.Connection, step: int) -> int:
        deleted = conn.execute("DELETE FROM windows WHERE step >= ?", (step,)).rowcount
        for table in ("layer_decisions", "changes", "guard_events"):
            conn.execute(f"DELETE FROM {table} WHERE step >= ?", (step,))
        self._count -= deleted
        return deleted

    def _retain(self, conn: sqlite3.Connection) -> None:
        excess = self._count - self.config.max_windows
        if excess > 0:
            row = conn.execute(
                "SELECT step FROM windows ORDER BY step LIMIT 1 OFFSET ?", (excess,)
            ).fetchone()
            if row is not None:
                first_kept = row[0]
                deleted = conn.execute("DELETE FROM windows WHERE step < ?", (first_kept,)).rowcount
                conn.execute("DELETE FROM layer_decisions WHERE step < ?", (first_kept,))
                conn.execute("DELETE FROM changes WHERE step < ?", (first_kept,))
                self._count -= deleted
        conn.execute(
            "DELETE FROM guard_events WHERE id <= (SELECT max(id) FROM guard_events) - ?",
            (self.config.max_guard_events,),
        )


# ---- reader ---------------------------------------------------------------------------------

_F = TypeVar("_F", bound=Callable[..., Any])


def _guarded(method: _F) -> _F:
    """Turn SQLite's corruption errors into a RunLogError naming the file."""

    @functools.wraps(method)
    def wrapper(self: RunReader, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as err:
            raise RunLogError(f"{self.path}: corrupt autocomp run log ({err})") from None

    return wrapper  # type: ignore[return-value]


class RunReader:
    """Queries over one run log, for the sidecar and reports (any process, while it is written).

    Every method runs in its own read transaction (a consistent WAL snapshot); to combine
    several calls into one snapshot, use ``with reader.snapshot(): ...``. Thread-safe (one
    connection behind a lock). Rows come back as plain dicts.
    """

    def __init__(self, path: Path | str, *, busy_timeout_s: float = 5.0) -> None:
        """Open ``path`` (a run directory or its ``run.db``) for reading.

        Raises:
            RunLogError: missing, not SQLite, foreign, other schema version, truncated, corrupt.
        """
        given = Path(path)
        if not given.exists():
            raise RunLogError(f"{given}: no such run directory or run log")
        db = _db_path(given)
        if not db.exists():
            raise RunLogError(f"{given}: no {DB_NAME} in this directory (not an autocomp run)")
        if not db.is_file():
            raise RunLogError(f"{db}: not a file")
        _check_file(db, allow_empty=False)
        self.path = db
        """The database file."""
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.RLock()
        self._depth = 0
        try:
            self._conn = _connect(
                db.resolve().as_uri() + "?mode=ro",
                uri=True,
                timeout=busy_timeout_s,
                check_same_thread=False,
            )
        except sqlite3.Error as err:
            raise RunLogError(f"{db}: cannot open: {err}") from None
        try:
            with self._read():
                self._meta = _check_runlog(self._conn, db)
        except RunLogError:
            self._conn.close()
            raise
        except sqlite3.DatabaseError as err:
            self._conn.close()
            text = str(err)
            if "not a database" in text:
                raise RunLogError(f"{db}: not an SQLite database ({text})") from None
            raise RunLogError(f"{db}: corrupt or unreadable run log ({text})") from None

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunReader({str(self.path)!r})"

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield self._conn
                finally:
                    self._depth -= 1
                return
            self._conn.execute("BEGIN")
            self._depth = 1
            try:
                yield self._conn
            finally:
                self._depth = 0
                if self._conn.in_transaction:  # ends the snapshot; nothing to commit
                    self._conn.execute("COMMIT")

    def snapshot(self) -> contextlib.AbstractContextManager[RunReader]:
        """Hold one read transaction: all reads inside see the same committed state."""

        @contextlib.contextmanager
        def hold() -> Iterator[RunReader]:
            with self._read():
                yield self

        return hold()

    def _dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._read() as conn:
            cursor = conn.execute(sql, params)
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    @staticmethod
    def _window(row: dict[str, Any]) -> dict[str, Any]:
        if "record" in row:
            row["record"] = json.loads(row["record"])
        return row

    # ---- queries ------------------------------------------------------------------------------

    @_guarded
    def meta(self) -> dict[str, Any]:
        """Run metadata (run_id, created, world_size, policy, layers, ...), JSON-decoded."""
        with self._read() as conn:
            return _read_meta(conn)

    @_guarded
    def latest_window(self) -> dict[str, Any] | None:
        """The newest window: flat columns plus ``record`` (the full record), or None."""
        rows = self._dicts(
            f"SELECT {', '.join(_FLAT_COLUMNS)}, record FROM windows ORDER BY step DESC LIMIT 1"
        )
        return self._window(rows[0]) if rows else None

    @_guarded
    def windows(
        self, since_step: int | None = None, limit: int = 1000, *, with_record: bool = True
    ) -> list[dict[str, Any]]:
        """Windows in step order: the first ``limit`` after ``since_step`` (for incremental
        polling), or the latest ``limit`` when ``since_step`` is None."""
        columns = ", ".join(_FLAT_COLUMNS) + (", record" if with_record else "")
        if since_step is None:
            sql = (
                f"SELECT * FROM (SELECT {columns} FROM windows ORDER BY step DESC LIMIT ?) "
                "ORDER BY step"
            )
            rows = self._dicts(sql, (limit,))
        else:
            sql = f"SELECT {columns} FROM windows WHERE step > ? ORDER BY step LIMIT ?"
            rows = self._dicts(sql, (since_step, limit))
        return [self._window(row) for row in rows]

    @_guarded
    def decisions(self, step: int | None = None) -> list[dict[str, Any]]:
        """The per-layer decision table at ``step`` (default: the latest window that has one),
        in model order; empty when there is none."""
        columns = ", ".join(_DECISION_COLUMNS)
        if step is None:
            return self._dicts(
                f"SELECT {columns} FROM layer_decisions "
                "WHERE step = (SELECT max(step) FROM layer_decisions) ORDER BY idx"
            )
        return self._dicts(
            f"SELECT {columns} FROM layer_decisions WHERE step = ? ORDER BY idx", (step,)
        )

    @_guarded
    def changes(self, since_step: int | None = None, limit: int = 10_000) -> list[dict[str, Any]]:
        """Plan switches (step, name, old_spec, new_spec) after ``since_step``, oldest first
        (the latest ``limit`` when ``since_step`` is None)."""
        return self._since("changes", "step, name, old_spec, new_spec", since_step, limit)

    @_guarded
    def guard_events(
        self, since_step: int | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """Guard decisions (id, step, guard, layer, detail, action), oldest first."""
        return self._since(
            "guard_events", "id, step, guard, layer, detail, action", since_step, limit
        )

    def _since(
        self, table: str, columns: str, since_step: int | None, limit: int
    ) -> list[dict[str, Any]]:
        if since_step is None:
            sql = (
                f"SELECT * FROM (SELECT {columns}, id AS _id FROM {table} ORDER BY id DESC LIMIT ?)"
            )
            rows = self._dicts(sql + " ORDER BY _id", (limit,))
        else:
            sql = (
                f"SELECT {columns}, id AS _id FROM {table} WHERE step > ? ORDER BY step, id LIMIT ?"
            )
            rows = self._dicts(sql, (since_step, limit))
        for row in rows:
            del row["_id"]
        return rows

    @_guarded
    def guard_counts(self) -> dict[str, int]:
        """Events per guard over the retained history."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT guard, count(*) FROM guard_events GROUP BY guard ORDER BY guard"
            ).fetchall()
        return {guard: count for guard, count in rows}

    @_guarded
    def series(self, limit: int = 2000) -> dict[str, list[Any]]:
        """Column lists of the latest ``limit`` windows (oldest first), ready for charts.

        ``compression_ratio`` is uncompressed / wire bytes per step (None when nothing was sent).
        """
        rows = self.windows(limit=limit, with_record=False)
        keys = (
            "step",
            "time",
            "bandwidth_bytes_per_s",
            "latency_s",
            "step_seconds",
            "exposed_seconds",
            "measured_overlap",
            "predicted_overlap",
            "bytes_per_step",
            "uncompressed_bytes_per_step",
            "loss",
        )
        out: dict[str, list[Any]] = {key: [row[key] for row in rows] for key in keys}
        out["compression_ratio"] = [
            row["uncompressed_bytes_per_step"] / row["bytes_per_step"]
            if row["bytes_per_step"] and row["uncompressed_bytes_per_step"] is not None
            else None
            for row in rows
        ]
        return out

    @_guarded
    def overrides(self, limit: int = 100) -> list[dict[str, Any]]:
        """The latest ``limit`` overrides, newest first, with their status."""
        return self._dicts(
            f"SELECT {', '.join(_OVERRIDE_COLUMNS)} FROM overrides ORDER BY id DESC LIMIT ?",
            (limit,),
        )

    @_guarded
    def check(self) -> list[str]:
        """SQLite's ``quick_check`` (reads every page: slow on big logs); ``["ok"]`` if sound."""
        with self._read() as conn:
            return [row[0] for row in conn.execute("PRAGMA quick_check")]

    # ---- the one write --------------------------------------------------------------------------

    def add_override(
        self, kind: str, *, glob: str | None = None, spec: str | None = None, who: str
    ) -> int:
        """Queue an operator override for the running job; returns its id.

        Opens a short write connection (waits up to ``busy_timeout_s`` for the writer's
        transaction). The controller applies it at its next window boundary and records the
        step. ``spec`` is not parsed here (no torch in this module): callers should validate it.

        Raises:
            ValueError: unknown ``kind``, or ``glob``/``spec`` missing or not allowed for it.
        """
        if kind not in OVERRIDE_KINDS:
            raise ValueError(
                f"override kind must be one of {', '.join(OVERRIDE_KINDS)}, got {kind!r}"
            )
        if kind in ("pin", "unpin"):
            if not glob:
                raise ValueError(f"override {kind!r} needs a glob")
            if kind == "pin" and not spec:
                raise ValueError("override 'pin' needs a spec")
            if kind == "unpin" and spec is not None:
                raise ValueError("override 'unpin' takes no spec")
        elif glob is not None or spec is not None:
            raise ValueError(f"override {kind!r} takes no glob or spec")
        if not who:
            raise ValueError("override needs 'who' (for the audit trail)")
        conn = _connect(str(self.path), timeout=self.busy_timeout_s)
        try:
            with _transaction(conn, "IMMEDIATE"):
                cursor = conn.execute(
                    "INSERT INTO overrides (created, who, kind, glob, spec) VALUES (?, ?, ?, ?, ?)",
                    (time.time(), who, kind, glob, spec),
                )
                override_id = cursor.lastrowid
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as err:
            raise RunLogError(f"{self.path}: corrupt autocomp run log ({err})") from None
        finally:
            conn.close()
        assert override_id is not None
        logger.info("autocomp run log %s: override %d %s by %s", self.path, override_id, kind, who)
        return override_id
