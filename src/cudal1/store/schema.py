"""Tables of the results store and the migrations that bring an older file up to date.

The schema version lives in the `schema_version` table (one row per applied migration). `MIGRATIONS` maps a
version to the statements that lead to it from the previous one; version 1 creates everything. Opening a
file runs the missing migrations in one `BEGIN IMMEDIATE` transaction, so several processes opening the
same new file at once apply them exactly once, and a process killed midway leaves the old version intact.

To change the schema: add `MIGRATIONS[n + 1]` (never edit an applied migration), and keep the store code
working on the new shape. A file from a newer cudal1 (version above ours) is refused, not downgraded.
Tables of other modules (exemplar and hack-case databases) live in the same file but are not listed here;
they create their own, with `CREATE TABLE IF NOT EXISTS`, through `ResultsStore.connect()`.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from datetime import datetime, timezone

from cudal1.store.connection import StoreError, write_transaction

logger = logging.getLogger(__name__)

Migration = tuple[str, ...] | Callable[[sqlite3.Connection], None]

_V1: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS tasks (
        task_id TEXT NOT NULL,
        source_hash TEXT NOT NULL,
        source TEXT NOT NULL,
        level INTEGER,
        origin TEXT NOT NULL DEFAULT '',
        meta_json TEXT NOT NULL DEFAULT '{}',
        created_at TEXT NOT NULL,
        PRIMARY KEY (task_id, source_hash)
    )""",
    "CREATE INDEX IF NOT EXISTS tasks_by_hash ON tasks (source_hash)",
    """CREATE TABLE IF NOT EXISTS candidates (
        candidate_hash TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        task_id TEXT,
        origin TEXT NOT NULL DEFAULT '',
        meta_json TEXT NOT NULL DEFAULT '{}',
        created_at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS candidates_by_task ON candidates (task_id)",
    """CREATE TABLE IF NOT EXISTS evaluations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT NOT NULL,
        task_id TEXT NOT NULL DEFAULT '',
        task_hash TEXT NOT NULL,
        candidate_hash TEXT NOT NULL,
        status TEXT NOT NULL,
        speedup REAL,
        speedup_warm REAL,
        ref_ms REAL,
        candidate_ms REAL,
        stability REAL,
        kernel_class TEXT,
        gpu_name TEXT,
        protocol_version TEXT,
        label TEXT NOT NULL DEFAULT '',
        run_id TEXT,
        created_at TEXT NOT NULL,
        result_json TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS evaluations_by_key ON evaluations (key, id)",
    "CREATE INDEX IF NOT EXISTS evaluations_by_task ON evaluations (task_id, candidate_hash, id)",
    "CREATE INDEX IF NOT EXISTS evaluations_by_status ON evaluations (status)",
    "CREATE INDEX IF NOT EXISTS evaluations_by_label ON evaluations (label)",
    "CREATE INDEX IF NOT EXISTS evaluations_by_run ON evaluations (run_id)",
    """CREATE TABLE IF NOT EXISTS baselines (
        task_hash TEXT NOT NULL,
        name TEXT NOT NULL,
        environment_key TEXT NOT NULL,
        protocol_version TEXT NOT NULL,
        ms REAL NOT NULL,
        extra_json TEXT NOT NULL DEFAULT '{}',
        created_at TEXT NOT NULL,
        PRIMARY KEY (task_hash, environment_key, protocol_version, name)
    )""",
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        config_json TEXT NOT NULL,
        summary_json TEXT,
        started_at TEXT NOT NULL,
        finished_at TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS run_progress (
        run_id TEXT NOT NULL,
        item_key TEXT NOT NULL,
        done_at TEXT NOT NULL,
        PRIMARY KEY (run_id, item_key)
    )""",
    """CREATE TABLE IF NOT EXISTS meta (
        key TEXT PRIMARY KEY,
        value_json TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
)

# version -> statements (or a callable) that migrate from version - 1. Never edit an applied entry.
MIGRATIONS: dict[int, Migration] = {1: _V1}


def utc_now_iso() -> str:
    """Current UTC time as ISO 8601 with milliseconds, e.g. `2025-01-31T12:00:00.123+00:00`."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def target_version() -> int:
    """The schema version this code writes: the highest key of `MIGRATIONS`."""
    return max(MIGRATIONS)


def read_version(conn: sqlite3.Connection) -> int:
    """Return the schema version recorded in the file (0 for a new or foreign file)."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone()
    if not exists:
        return 0
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _apply(conn: sqlite3.Connection, migration: Migration) -> None:
    if callable(migration):
        migration(conn)
        return
    for statement in migration:
        conn.execute(statement)


def ensure_schema(conn: sqlite3.Connection, *, where: str = "results store") -> int:
    """Create or migrate the schema on `conn` to `target_version()`; return the version now in the file.

    Raises `StoreError` if the file was written by a newer schema.
    """
    target = target_version()
    current = read_version(conn)
    if current == target:
        return current  # fast path: no write lock needed
    if current > target:
        raise StoreError(f"{where} has schema version {current}, newer than this cudal1 ({target}); "
                         f"upgrade cudal1 or use another store path")
    with write_transaction(conn):
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version "
                     "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
        current = read_version(conn)  # another process may have migrated while we waited for the lock
        for version in range(current + 1, target + 1):
            if version not in MIGRATIONS:
                raise StoreError(f"{where}: no migration to schema version {version}")
            logger.info("%s: migrating schema to version %d", where, version)
            _apply(conn, MIGRATIONS[version])
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                         (version, utc_now_iso()))
    return max(current, target)
