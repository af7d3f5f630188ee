"""The run log's writer (rank 0): window records go to disk off the training thread.

:meth:`RunLog.append_window` only puts the record on a bounded in-memory queue; a daemon
thread serializes it and writes it in a transaction, so the training thread never waits for
the disk. When the disk falls behind, the oldest queued record is dropped (and counted) rather
than slowing training down. Override acknowledgements ride along on the same thread, so they
cannot interleave with a window write.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import secrets
import socket
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import overrides
from .overrides import Applied, Override, OverrideInbox
from .schema import (
    DB_NAME,
    DECISION_COLUMNS,
    FLAT_COLUMNS,
    FORMAT,
    RESERVED_META,
    RUNS_DIR,
    SCHEMA_VERSION,
    WINDOW_COLUMNS,
    RunLogError,
    check_file,
    check_runlog,
    connect,
    create,
    tables,
    transaction,
)

logger = logging.getLogger(__name__)


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
        *(_num(record.get(column)) for column in WINDOW_COLUMNS),
        len(changes),
        len(guards),
        _dumps(record),
    )
    return _Rows(step=step, window=window, decisions=decisions, changes=changes, guards=guards)


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
        self._inbox = OverrideInbox(reader, db_path)
        self._cond = threading.Condition()
        self._records: deque[tuple[float, Mapping[str, Any]]] = deque()
        self._ops: deque[Applied] = deque()
        self._busy = False
        self._stopping = False
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
            check_file(db, allow_empty=True)
        timeout = config.busy_timeout_s
        writer = connect(str(db), timeout=timeout, check_same_thread=False)
        try:
            cls._prepare(writer, db, run_id, meta)
            reader = connect(str(db), timeout=timeout, check_same_thread=False)
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
        if tables(conn):
            check_runlog(conn, db)
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            logger.warning("autocomp run log %s: journal_mode is %s, not WAL", db, mode)
        conn.execute("PRAGMA synchronous = NORMAL")
        now = time.time()
        with transaction(conn, "IMMEDIATE"):
            if tables(conn):  # re-check under the lock: another process may have created it
                stored = check_runlog(conn, db)
                if stored.get("run_id") != run_id:
                    raise ValueError(
                        f"{db}: belongs to run {stored.get('run_id')!r}, not {run_id!r}; "
                        "use a new run directory"
                    )
                values = {k: v for k, v in meta.items() if k not in RESERVED_META}
                values["resumed"] = [*stored.get("resumed", []), now]
            else:
                create(conn)
                values = {
                    "hostname": socket.gethostname(),
                    "autocomp_version": _autocomp_version(),
                    **{k: v for k, v in meta.items() if k not in RESERVED_META},
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
        return self._inbox.pending()

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
        self._inbox.hide(ids)
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
        self._inbox.close()
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
        self, batch: list[tuple[float, Mapping[str, Any]]], ops: list[Applied]
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
            with transaction(conn, "IMMEDIATE"):
                for item in rows:
                    self._insert(conn, item)
                self._retain(conn)
                overrides.write_applied(conn, ops, time.time())
        except BaseException:
            # Rolled back: the counters must describe the table again. The batch is lost
            # (logged by the caller); marked overrides stay hidden from pending_overrides in
            # this process, and show as pending again only after a restart.
            self._last_step, self._count = saved
            raise
        self.written += len(rows)
        if ops:
            self._inbox.committed(ops)  # after the commit: the rows now say applied

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
            f"INSERT INTO windows ({', '.join(FLAT_COLUMNS)}, record) "
            f"VALUES ({', '.join('?' * (len(FLAT_COLUMNS) + 1))})",
            rows.window,
        )
        conn.executemany(
            f"INSERT INTO layer_decisions ({', '.join(DECISION_COLUMNS)}) "
            f"VALUES ({', '.join('?' * len(DECISION_COLUMNS))})",
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
