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

The package, by concept:

* :mod:`~autocomp.runlog.schema`: tables, column lists, the schema version
  (:data:`SCHEMA_VERSION`, in ``PRAGMA user_version`` and in the ``meta`` table;
  ``PRAGMA application_id`` marks the file as an autocomp run log). Opening anything else --
  a foreign SQLite file, another schema version, a corrupt or truncated file -- raises
  :class:`RunLogError` with the path and what is wrong.
* :mod:`~autocomp.runlog.writer`: :class:`RunLog` (rank 0 of the trainer).
  :meth:`RunLog.append_window` only queues the record; a daemon thread writes it, so the
  training thread never waits for the disk.
* :mod:`~autocomp.runlog.reader`: :class:`RunReader` (any process): the queries.
* :mod:`~autocomp.runlog.overrides`: operator overrides, posted by readers
  (:meth:`RunReader.add_override`), read and acknowledged by the trainer.

Nothing here imports torch or the rest of autocomp, so that readers stay light.
"""

from __future__ import annotations

from .overrides import Override
from .reader import RunReader
from .schema import (
    APPLICATION_ID,
    DB_NAME,
    FORMAT,
    OVERRIDE_KINDS,
    RUNS_DIR,
    SCHEMA_VERSION,
    RunLogError,
)
from .writer import RunLog, default_run_dir, new_run_id

__all__ = [
    "APPLICATION_ID",
    "DB_NAME",
    "FORMAT",
    "OVERRIDE_KINDS",
    "RUNS_DIR",
    "SCHEMA_VERSION",
    "Override",
    "RunLog",
    "RunLogError",
    "RunReader",
    "default_run_dir",
    "new_run_id",
]
