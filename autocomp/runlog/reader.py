"""Reading a run log from any process, while it is being written: the sidecar, reports, tests.

Every query runs in its own read transaction on a read-only connection, so in WAL mode a
reader sees a consistent committed snapshot and never blocks the trainer's writer. The one
write a reader may do, posting an operator override, goes through
:mod:`autocomp.runlog.overrides` on a short connection of its own.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .overrides import post as post_override
from .schema import (
    DB_NAME,
    DECISION_COLUMNS,
    FLAT_COLUMNS,
    OVERRIDE_COLUMNS,
    RunLogError,
    check_file,
    check_runlog,
    connect,
    db_path,
    read_meta,
)

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
        db = db_path(given)
        if not db.exists():
            raise RunLogError(f"{given}: no {DB_NAME} in this directory (not an autocomp run)")
        if not db.is_file():
            raise RunLogError(f"{db}: not a file")
        check_file(db, allow_empty=False)
        self.path = db
        """The database file."""
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.RLock()
        self._depth = 0
        try:
            self._conn = connect(
                db.resolve().as_uri() + "?mode=ro",
                uri=True,
                timeout=busy_timeout_s,
                check_same_thread=False,
            )
        except sqlite3.Error as err:
            raise RunLogError(f"{db}: cannot open: {err}") from None
        try:
            with self._read():
                self._meta = check_runlog(self._conn, db)
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
            return read_meta(conn)

    @_guarded
    def latest_window(self) -> dict[str, Any] | None:
        """The newest window: flat columns plus ``record`` (the full record), or None."""
        rows = self._dicts(
            f"SELECT {', '.join(FLAT_COLUMNS)}, record FROM windows ORDER BY step DESC LIMIT 1"
        )
        return self._window(rows[0]) if rows else None

    @_guarded
    def windows(
        self, since_step: int | None = None, limit: int = 1000, *, with_record: bool = True
    ) -> list[dict[str, Any]]:
        """Windows in step order: the first ``limit`` after ``since_step`` (for incremental
        polling), or the latest ``limit`` when ``since_step`` is None."""
        columns = ", ".join(FLAT_COLUMNS) + (", record" if with_record else "")
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
        columns = ", ".join(DECISION_COLUMNS)
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
            f"SELECT {', '.join(OVERRIDE_COLUMNS)} FROM overrides ORDER BY id DESC LIMIT ?",
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
        return post_override(
            self.path, kind, glob=glob, spec=spec, who=who, busy_timeout_s=self.busy_timeout_s
        )
