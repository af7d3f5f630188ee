"""Operator overrides: posted by any process, read and acknowledged by the trainer.

An operator (the sidecar's bearer-token API, a script) posts a request -- pin a layer glob,
force everything uncompressed, freeze the plan -- as a row of the ``overrides`` table. The
trainer reads the pending rows at its window boundary, applies them on every rank, and the
run log's writer thread records the step at which each was applied (or why it was rejected).

The three steps live here together because their invariant spans processes and threads: an
override is applied exactly once. Row ids are never reused (``AUTOINCREMENT``); the trainer
acknowledges by id; and between the training thread marking ids applied and the writer
thread committing that, :class:`OverrideInbox` hides those ids, so a window boundary in
between never hands the same override out twice.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .schema import OVERRIDE_COLUMNS, OVERRIDE_KINDS, RunLogError, connect, transaction

logger = logging.getLogger(__name__)

Applied = tuple[list[int], int, str]
"""One acknowledgement queued for the writer thread: (ids, step, status)."""


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
    """One of :data:`~autocomp.runlog.OVERRIDE_KINDS`."""
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


# ---- posting (any process) ------------------------------------------------------------------


def check_request(kind: str, glob: str | None, spec: str | None, who: str) -> None:
    """Raise ValueError unless ``kind`` takes exactly the ``glob``/``spec`` given.

    ``spec`` is not parsed here (no torch in the run log): callers validate it.
    """
    if kind not in OVERRIDE_KINDS:
        raise ValueError(f"override kind must be one of {', '.join(OVERRIDE_KINDS)}, got {kind!r}")
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


def post(
    db: Path,
    kind: str,
    *,
    glob: str | None,
    spec: str | None,
    who: str,
    busy_timeout_s: float,
) -> int:
    """Insert a pending override into ``db`` on a short write connection; returns its id.

    Waits up to ``busy_timeout_s`` for the trainer's write transaction.

    Raises:
        ValueError: the request is malformed (:func:`check_request`), or the file is corrupt
            (:class:`~autocomp.runlog.RunLogError`).
    """
    check_request(kind, glob, spec, who)
    conn = connect(str(db), timeout=busy_timeout_s)
    try:
        with transaction(conn, "IMMEDIATE"):
            cursor = conn.execute(
                "INSERT INTO overrides (created, who, kind, glob, spec) VALUES (?, ?, ?, ?, ?)",
                (time.time(), who, kind, glob, spec),
            )
            override_id = cursor.lastrowid
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as err:
        raise RunLogError(f"{db}: corrupt autocomp run log ({err})") from None
    finally:
        conn.close()
    assert override_id is not None
    logger.info("autocomp run log %s: override %d %s by %s", db, override_id, kind, who)
    return override_id


# ---- acknowledging (the trainer) ------------------------------------------------------------


def write_applied(conn: sqlite3.Connection, acknowledged: Iterable[Applied], now: float) -> None:
    """Record applied (or rejected) overrides, inside the writer thread's transaction."""
    for ids, step, status in acknowledged:
        conn.executemany(
            "UPDATE overrides SET applied_step = ?, applied_time = ?, status = ? WHERE id = ?",
            [(step, now, status, i) for i in ids],
        )


class OverrideInbox:
    """The trainer's view of pending overrides (rank 0, training thread).

    Owns a read connection of its own, so reading never waits for the writer thread's
    connection. Ids marked applied stay hidden from :meth:`pending` until the writer thread
    has committed the acknowledgement (:meth:`committed`); if that commit fails they stay
    hidden in this process and show as pending again only after a restart.
    """

    def __init__(self, conn: sqlite3.Connection, db: Path) -> None:
        self.path = db
        self._conn = conn
        self._lock = threading.Lock()
        self._hidden: set[int] = set()
        self._closed = False

    def pending(self) -> list[Override]:
        """Overrides not yet applied, oldest first (one indexed read; empty on a read error)."""
        with self._lock:
            if self._closed:
                return []
            try:
                rows = self._conn.execute(
                    f"SELECT {', '.join(OVERRIDE_COLUMNS)} FROM overrides "
                    "WHERE applied_step IS NULL ORDER BY id"
                ).fetchall()
            except sqlite3.Error:
                logger.warning(
                    "autocomp run log %s: cannot read overrides", self.path, exc_info=True
                )
                return []
            return [
                Override(**dict(zip(OVERRIDE_COLUMNS, row, strict=True)))
                for row in rows
                if row[0] not in self._hidden
            ]

    def hide(self, ids: Sequence[int]) -> None:
        """Stop handing out ``ids`` (marked applied, acknowledgement not yet written)."""
        with self._lock:
            self._hidden.update(ids)

    def committed(self, acknowledged: Iterable[Applied]) -> None:
        """The writer committed these acknowledgements: the rows now say applied."""
        with self._lock:
            for ids, _, _ in acknowledged:
                self._hidden.difference_update(ids)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._conn.close()
