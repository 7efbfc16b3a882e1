"""`ResultsStore`: the SQLite file that every measured thing lands in.

It holds tasks and candidates (by source hash), evaluations (the full `EvalResult` as JSON plus indexed
columns), cached baseline timings, runs with their resolved configs and per-item progress (for resuming a
batch job), and a small key/value `meta` table (e.g. measured device peaks).

Reuse: `eval_key(task_hash, candidate_hash, protocol, environment)` names an evaluation (see
`cudal1.store.keys` for the exact fields); `get_evaluation(key)` returns the latest result stored under it
with `cached=True`, or None. Callers decide when to force a re-evaluation (they skip the lookup and
`put_evaluation` again; the newest row then wins). Whether a failed status (timeout, runtime error) is
worth reusing is also the caller's policy: the store returns whatever is latest.

Concurrency: many processes may write at once (WAL, `BEGIN IMMEDIATE`, busy timeout and retries; see
`cudal1.store.connection`). Within a process the store is thread-safe: each thread gets its own
connection. After `fork()` the child opens new connections instead of reusing the parent's.

Limits: one machine (a shared file system or several hosts need a server database, not implemented here);
no deletion or vacuuming API; JSON columns are not queried by SQL beyond the indexed columns.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

from cudal1.core.types import EvalResult, Status
from cudal1.store import keys
from cudal1.store.connection import (
    StoreError,
    open_connection,
    resolve_store_path,
    retry_on_lock,
    write_transaction,
)
from cudal1.store.schema import ensure_schema, utc_now_iso

logger = logging.getLogger(__name__)

# The indexed columns of `evaluations`, in the order they are returned by `query_evaluations`.
EVALUATION_COLUMNS: tuple[str, ...] = (
    "id", "key", "task_id", "task_hash", "candidate_hash", "status", "speedup", "speedup_warm", "ref_ms",
    "candidate_ms", "stability", "kernel_class", "gpu_name", "protocol_version", "label", "run_id",
    "created_at",
)


_INSERT_TASK = ("INSERT OR IGNORE INTO tasks (task_id, source_hash, source, level, origin, meta_json, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)")
_INSERT_CANDIDATE = ("INSERT OR IGNORE INTO candidates (candidate_hash, source, task_id, origin, meta_json, "
                     "created_at) VALUES (?, ?, ?, ?, ?, ?)")
_INSERT_EVALUATION = ("INSERT INTO evaluations (key, task_id, task_hash, candidate_hash, status, speedup, speedup_warm, "
                      "ref_ms, candidate_ms, stability, kernel_class, gpu_name, protocol_version, label, run_id, "
                      "created_at, result_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def _protocol_version(result: EvalResult) -> str | None:
    for name in ("protocol_version", "version"):
        value = result.protocol.get(name)
        if value is not None:
            return str(value)
    return None


def _evaluation_row(result: EvalResult, data: dict[str, Any], *, task_hash: str, key: str, label: str,
                    run_id: str | None, version: Any, created_at: str) -> tuple[Any, ...]:
    """The values of one `evaluations` row, in the column order of the INSERTs above. A verdict whose paid
    figures are not finite (`EvalResult.non_finite_figures`) is refused: every reader of the store would
    take its NaN for a number."""
    not_finite = result.non_finite_figures()
    if not_finite:
        raise StoreError(f"refusing to store a {result.status.value} result for {result.task_id or 'a task'} whose "
                         f"{', '.join(not_finite[:3])} is not a finite number")
    return (key, result.task_id, task_hash, result.candidate_hash, result.status.value, result.speedup,
            data["speedup_warm"], result.ref_ms, result.candidate_ms, result.stability, data["kernel_class"],
            _gpu_name(result), version, label, run_id, created_at, keys.to_json(data))


def _gpu_name(result: EvalResult) -> str | None:
    for name in ("gpu_name", "gpu"):
        value = result.environment.get(name)
        if value:
            return str(value)
    return None


class ResultsStore:
    """The results store on one SQLite file; see the module docstring. Usable as a context manager."""

    def __init__(self, path: str | os.PathLike[str] | None = None):
        """Open (creating or migrating) the store at `path`, default `default_store_path()`.

        Raises `StoreError` when the path is a directory, unreadable, or not an SQLite database.
        """
        self.path: Path = resolve_store_path(path)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._closed = False
        conn = self._conn()
        try:
            self.schema_version = retry_on_lock(lambda: ensure_schema(conn, where=str(self.path)),
                                                what=f"migrating {self.path}")
        except BaseException:
            self.close()
            raise
        logger.debug("results store %s open (schema version %d)", self.path, self.schema_version)

    # ----------------------------------------------------------------------------------------- plumbing
    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError(f"results store {self.path} is closed")
        if os.getpid() != self._pid:
            # Forked: never touch the parent's connections (or its lock, which another thread may have held
            # at fork time); start afresh.
            self._lock = threading.Lock()
            self._pid = os.getpid()
            self._connections = []
            self._local = threading.local()
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = open_connection(self.path, check_same_thread=False)
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def connect(self) -> sqlite3.Connection:
        """Return a new configured connection (WAL, busy timeout, autocommit) for other modules' tables.

        The caller owns and closes it. Write with `cudal1.store.write_transaction(conn)`, which takes the
        write lock up front and retries while it is busy.
        """
        if self._closed:
            raise StoreError(f"results store {self.path} is closed")
        return open_connection(self.path)

    def close(self) -> None:
        """Close every connection this store opened. Further use raises `StoreError`."""
        with self._lock:
            connections, self._connections = self._connections, []
            self._closed = True
        if os.getpid() != self._pid:
            return
        for conn in connections:
            try:
                conn.close()
            except sqlite3.Error as exc:
                logger.debug("closing a store connection: %s", exc)

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ResultsStore({str(self.path)!r})"

    def _write(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        conn = self._conn()
        with write_transaction(conn):
            return conn.execute(sql, params)

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        conn = self._conn()

        def run() -> list[dict[str, Any]]:
            cursor = conn.execute(sql, params)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

        return retry_on_lock(run, what=f"reading {self.path}")

    # ------------------------------------------------------------------------------- tasks, candidates
    def put_task(self, task_id: str, source: str, level: int | None = None, origin: str = "",
                 meta: dict[str, Any] | None = None) -> str:
        """Store a task's reference source; return its source hash.

        Idempotent per (task_id, source hash): the first write's level/origin/meta are kept. A changed
        source for the same task_id is stored as a new version next to the old one.
        """
        digest = keys.source_hash(source)
        self._write(_INSERT_TASK, (task_id, digest, source, level, origin, keys.to_json(meta or {}), utc_now_iso()))
        return digest

    def get_task(self, task_id: str, source_hash: str | None = None) -> dict[str, Any] | None:
        """Return a task version as a dict (`meta` decoded): the given hash, else the newest version."""
        sql = "SELECT rowid AS _row, * FROM tasks WHERE task_id = ?"
        params: tuple[Any, ...] = (task_id,)
        if source_hash is not None:
            sql += " AND source_hash = ?"
            params += (source_hash,)
        rows = self._read(sql + " ORDER BY rowid DESC LIMIT 1", params)
        if not rows:
            return None
        row = rows[0]
        row.pop("_row")
        row["meta"] = json.loads(row.pop("meta_json"))
        return row

    def task_versions(self, task_id: str) -> list[str]:
        """Source hashes stored for `task_id`, oldest first."""
        rows = self._read("SELECT source_hash FROM tasks WHERE task_id = ? ORDER BY rowid", (task_id,))
        return [r["source_hash"] for r in rows]

    def put_candidate(self, source: str, task_id: str | None = None, origin: str = "",
                      meta: dict[str, Any] | None = None) -> str:
        """Store a candidate source; return its sha256. Idempotent: the first write's fields are kept."""
        digest = keys.source_hash(source)
        self._write(_INSERT_CANDIDATE, (digest, source, task_id, origin, keys.to_json(meta or {}), utc_now_iso()))
        return digest

    def get_candidate(self, candidate_hash: str) -> dict[str, Any] | None:
        """Return a stored candidate as a dict (`meta` decoded), or None."""
        rows = self._read("SELECT * FROM candidates WHERE candidate_hash = ?", (candidate_hash,))
        if not rows:
            return None
        row = rows[0]
        row["meta"] = json.loads(row.pop("meta_json"))
        return row

    # ------------------------------------------------------------------------------------- evaluations
    eval_key = staticmethod(keys.eval_key)

    def put_evaluation(self, result: EvalResult, *, task_hash: str, key: str, label: str = "",
                       run_id: str | None = None, protocol_version: str | None = None) -> int:
        """Store one evaluation; return its row id. Several rows per key may exist; the newest wins.

        Indexed columns come from the result: `task_id`, `candidate_hash`, `status`, timings, `gpu_name`
        (`environment["gpu_name"]`, else `["gpu"]`) and `protocol_version` (the argument, else
        `protocol["protocol_version"]`, else `protocol["version"]`).
        """
        stored = result.replace(cached=False) if result.cached else result
        version = protocol_version if protocol_version is not None else _protocol_version(result)
        row = _evaluation_row(result, stored.to_dict(), task_hash=task_hash, key=key, label=label, run_id=run_id,
                              version=version, created_at=utc_now_iso())
        cursor = self._write(_INSERT_EVALUATION, row)
        return int(cursor.lastrowid)

    def record_evaluation(self, task: Any, source: str, result: EvalResult, *, key: str, label: str = "",
                          run_id: str | None = None, candidate_origin: str = "") -> int:
        """Store a verdict with the task and candidate it is about, in one transaction (never a row whose
        candidate or reference is missing); returns the evaluation's row id. `task` is anything with `id`,
        `source`, `hash`, `level` and `origin` (a `cudal1.tasks.Task`); the row names them whatever the
        result says."""
        result = result.replace(cached=False, task_id=task.id, candidate_hash=keys.source_hash(source))
        data = result.to_dict()
        now = utc_now_iso()
        conn = self._conn()
        with write_transaction(conn):
            conn.execute(_INSERT_TASK, (task.id, keys.source_hash(task.source), task.source, task.level,
                                        task.origin, "{}", now))
            conn.execute(_INSERT_CANDIDATE, (keys.source_hash(source), source, task.id, candidate_origin, "{}", now))
            cursor = conn.execute(
                _INSERT_EVALUATION,
                _evaluation_row(result, data, task_hash=task.hash, key=key, label=label, run_id=run_id,
                                version=_protocol_version(result), created_at=now))
        return int(cursor.lastrowid)

    def get_evaluation(self, key: str) -> EvalResult | None:
        """Return the newest result stored under `key` with `cached=True`, or None."""
        rows = self._read("SELECT result_json FROM evaluations WHERE key = ? ORDER BY id DESC LIMIT 1", (key,))
        if not rows:
            return None
        return EvalResult.from_dict(json.loads(rows[0]["result_json"])).replace(cached=True)

    def lookup(self, task_hash: str, candidate_hash: str, protocol: dict[str, Any],
               environment: dict[str, Any], *, force: bool = False,
               limits: dict[str, float] | None = None) -> tuple[str, EvalResult | None]:
        """Compute the evaluation key and return `(key, cached result or None)`; `force=True` never hits.

        With `limits` (`EvalConfig.limits()`), a stored timeout obtained under a smaller limit than asked
        for, or under one it did not record (older versions), is not a hit: the candidate gets the time it
        is now allowed.
        """
        key = keys.eval_key(task_hash, candidate_hash, protocol, environment)
        hit = None if force else self.get_evaluation(key)
        if hit is not None and hit.status is Status.TIMEOUT and limits:
            recorded = hit.protocol
            if any(recorded.get(name, 0.0) < asked for name, asked in limits.items()):
                return key, None
        return key, hit

    def query_evaluations(self, *, task_id: str | None = None, status: Status | str | None = None,
                          label: str | None = None, run_id: str | None = None, gpu_name: str | None = None,
                          candidate_hash: str | None = None, key: str | None = None,
                          latest_per_task_candidate: bool = False, after_id: int | None = None) -> list[dict[str, Any]]:
        """Return matching evaluations, oldest first, as dicts of the indexed columns plus `result`.

        `result` is the decoded `EvalResult.to_dict()`. With `latest_per_task_candidate`, only the newest
        row per (task_id, candidate_hash) among the rows matching the other filters is kept, and *then*
        `status` is applied: a forced re-evaluation that failed hides an older success. `after_id` keeps rows
        stored after the one with that id (a reader catching up).
        """
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("task_id", task_id), ("label", label), ("run_id", run_id),
                              ("gpu_name", gpu_name), ("candidate_hash", candidate_hash), ("key", key)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        cond = " AND ".join(where) if where else "1"
        if latest_per_task_candidate:
            cond = (f"id IN (SELECT MAX(id) FROM evaluations WHERE {cond} "
                    "GROUP BY task_id, candidate_hash)")
        if status is not None:
            cond += " AND status = ?"
            params.append(Status(status).value)
        if after_id is not None:
            cond += " AND id > ?"
            params.append(int(after_id))
        columns = ", ".join(EVALUATION_COLUMNS)
        rows = self._read(f"SELECT {columns}, result_json FROM evaluations WHERE {cond} ORDER BY id",
                          tuple(params))
        for row in rows:
            row["result"] = json.loads(row.pop("result_json"))
        return rows

    # --------------------------------------------------------------------------------------- baselines
    def put_baseline(self, task_hash: str, name: str, environment_key: str, protocol_version: str | int,
                     ms: float, extra: dict[str, Any] | None = None) -> None:
        """Cache one baseline time (e.g. name `eager`, `compile_default`, `cuda_graph`); replaces an older one.

        `environment_key` is usually `cudal1.store.environment_key(environment)`.
        """
        self._write(
            "INSERT OR REPLACE INTO baselines (task_hash, name, environment_key, protocol_version, ms, "
            "extra_json, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (task_hash, name, environment_key, str(protocol_version), float(ms), keys.to_json(extra or {}),
             utc_now_iso()))

    def get_baseline(self, task_hash: str, name: str, environment_key: str,
                     protocol_version: str | int) -> dict[str, Any] | None:
        """Return `{"ms", "extra", "created_at"}` of a cached baseline, or None."""
        found = self.list_baselines(task_hash, environment_key, protocol_version)
        return found.get(name)

    def list_baselines(self, task_hash: str, environment_key: str,
                       protocol_version: str | int) -> dict[str, dict[str, Any]]:
        """Return every cached baseline of a task for one environment and protocol: name -> record."""
        rows = self._read(
            "SELECT name, ms, extra_json, created_at FROM baselines "
            "WHERE task_hash = ? AND environment_key = ? AND protocol_version = ? ORDER BY name",
            (task_hash, environment_key, str(protocol_version)))
        return {r["name"]: {"ms": r["ms"], "extra": json.loads(r["extra_json"]), "created_at": r["created_at"]}
                for r in rows}

    # -------------------------------------------------------------------------------- runs, progress
    def start_run(self, kind: str, config: dict[str, Any]) -> str:
        """Record a new run (e.g. kind `eval`, `optimize`, `grpo`) with its fully resolved config; return its id."""
        stamp = utc_now_iso()
        compact = stamp[:19].replace("-", "").replace(":", "")  # 20250131T120000
        run_id = f"{kind}-{compact}-{uuid.uuid4().hex[:8]}"
        self._write("INSERT INTO runs (run_id, kind, status, config_json, started_at) VALUES (?, ?, ?, ?, ?)",
                    (run_id, kind, "running", keys.to_json(config), stamp))
        return run_id

    def finish_run(self, run_id: str, summary: dict[str, Any]) -> None:
        """Mark a run finished with its summary. Raises `StoreError` for an unknown run id."""
        cursor = self._write(
            "UPDATE runs SET status = 'finished', summary_json = ?, finished_at = ? WHERE run_id = ?",
            (keys.to_json(summary), utc_now_iso(), run_id))
        if cursor.rowcount == 0:
            raise StoreError(f"unknown run id: {run_id}")

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """Return a run as `{run_id, kind, status, config, summary, started_at, finished_at}`, or None."""
        rows = self._read("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            return None
        row = rows[0]
        row["config"] = json.loads(row.pop("config_json"))
        summary = row.pop("summary_json")
        row["summary"] = json.loads(summary) if summary is not None else None
        return row

    def list_runs(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Return `{run_id, kind, status, started_at, finished_at}` of all runs (of one kind), oldest first."""
        sql = "SELECT run_id, kind, status, started_at, finished_at FROM runs"
        params: tuple[Any, ...] = ()
        if kind is not None:
            sql += " WHERE kind = ?"
            params = (kind,)
        return self._read(sql + " ORDER BY started_at, run_id", params)

    def mark_done(self, run_id: str, item_key: str) -> None:
        """Record that `item_key` of `run_id` is finished (idempotent), so a resumed run skips it."""
        self._write("INSERT OR IGNORE INTO run_progress (run_id, item_key, done_at) VALUES (?, ?, ?)",
                    (run_id, item_key, utc_now_iso()))

    def mark_undone(self, run_id: str, item_key: str) -> None:
        """Forget that `item_key` of `run_id` was finished, so that a resumed run does it again."""
        self._write("DELETE FROM run_progress WHERE run_id = ? AND item_key = ?", (run_id, item_key))

    def done_items(self, run_id: str) -> set[str]:
        """Return the item keys already marked done for `run_id`."""
        return {r["item_key"] for r in self._read("SELECT item_key FROM run_progress WHERE run_id = ?",
                                                  (run_id,))}

    # -------------------------------------------------------------------------------------------- meta
    def put_meta(self, key: str, value: dict[str, Any]) -> None:
        """Store a small JSON value under `key` (e.g. measured device peaks), replacing an older one."""
        self._write("INSERT OR REPLACE INTO meta (key, value_json, updated_at) VALUES (?, ?, ?)",
                    (key, keys.to_json(value), utc_now_iso()))

    def get_meta(self, key: str) -> dict[str, Any] | None:
        """Return the value stored under `key`, or None."""
        rows = self._read("SELECT value_json FROM meta WHERE key = ?", (key,))
        return json.loads(rows[0]["value_json"]) if rows else None
