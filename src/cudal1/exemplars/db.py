"""The per-task exemplar database of contrastive RL: every successful candidate with its score.

Stored in SQLite (normally the results-store database file; this module owns only the `exemplars`
table). Each row is one distinct candidate per task: code, score (speedup over the reference), every
evaluation's score, model, creation time and hashes. Candidates are deduplicated by their *normalised*
source (docstrings, comments, blank lines and formatting removed through `ast.unparse` when the code
parses, else comment and blank-line stripping); a duplicate is one more evaluation of the same source: its
score joins the row's scores and the row's score becomes their `statistic` (the median by default; the
most recent `MAX_SCORES_KEPT` count). The maximum of every evaluation ever seen (`statistic="max"`, the
behaviour before 2026-12-04) is a winner's curse: with evaluation noise a source's score drifts upward each
time it is evaluated again (a recheck moved a 3.05x exemplar to 1.48x). At most `max_per_task` rows are kept
per task (default 256; design section 5 leaves the size open): the lowest scores are evicted first,
the oldest first among equal scores.

Scores are keyed by what measured them (`context`, `score_context`: the GPU, the evaluator's profile, its
protocol version and problem sizes): a speedup measured on an H100 under `strict` is not one of an A100
under `cuda-l1`. A source evaluated in two contexts has one row in each, whose scores are never mixed; a
database opened with a `context` lists and counts the rows of that context only (opened without one, all
rows, as before contexts existed; rows written before then have the empty context).

Limits: string contents (e.g. CUDA sources inside Python strings) are compared verbatim, so two kernels
that differ only in CUDA comments are distinct. Each call opens its own short connection, configured as the
results store's are (WAL, busy timeout, retries when a lock stays busy: two training ranks opening a fresh
file at once is such a case), which makes the database safe to share between threads and processes; an
in-memory database (":memory:") therefore does not persist between calls and is refused.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import io
import json
import logging
import math
import sqlite3
import statistics
import time
import tokenize
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.core.syntax import parse as parse_python
from cudal1.store.connection import open_connection, write_transaction

logger = logging.getLogger(__name__)

DEFAULT_MAX_PER_TASK = 256
#: The evaluations whose scores a row keeps (the most recent): enough for a stable median, bounded in size.
MAX_SCORES_KEPT = 64
#: How a row's score is made from its evaluations' scores.
STATISTICS = {"median": statistics.median, "mean": statistics.fmean, "max": max}

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS exemplars(
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        task_id TEXT NOT NULL,
        context TEXT NOT NULL DEFAULT '',
        norm_hash TEXT NOT NULL,
        source_hash TEXT NOT NULL,
        code TEXT NOT NULL,
        score REAL NOT NULL,
        model TEXT NOT NULL DEFAULT '',
        meta_json TEXT NOT NULL DEFAULT '{}',
        scores_json TEXT NOT NULL DEFAULT '[]',
        created_s REAL NOT NULL,
        updated_s REAL NOT NULL,
        UNIQUE(task_id, context, norm_hash)
    )""",
    "CREATE INDEX IF NOT EXISTS exemplars_task_score ON exemplars(task_id, score)",
)
#: The columns of a file written before `context` existed, copied when it is migrated.
_OLD_COLUMNS = ("id", "task_id", "norm_hash", "source_hash", "code", "score", "model", "meta_json", "scores_json",
                "created_s", "updated_s")


def score_context(result: Any) -> str:
    """What measured a verdict's speedup, as an exemplar's score key: 'GPU | profile | protocol version |
    sizes' from an `EvalResult`'s (or its `to_dict()`'s) environment and protocol ('' when it records
    neither)."""
    if isinstance(result, dict):
        env, protocol = result.get("environment") or {}, result.get("protocol") or {}
    else:
        env, protocol = getattr(result, "environment", None) or {}, getattr(result, "protocol", None) or {}
    parts = (env.get("gpu_name"), protocol.get("profile"), protocol.get("version"), protocol.get("sizes"))
    if not any(parts):
        return ""
    return " | ".join("?" if p is None else str(p) for p in parts)


@dataclass(frozen=True)
class ScoredCode:
    """A candidate's source with its score (speedup over the reference) and free-form metadata."""

    code: str
    score: float
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


class AddResult(str, enum.Enum):
    """What `ExemplarDB.add` did."""

    INSERTED = "inserted"  # a new distinct candidate
    IMPROVED = "improved"  # a duplicate whose score raised the row's statistic
    LOWERED = "lowered"  # a duplicate whose score lowered the row's statistic
    DUPLICATE = "duplicate"  # a duplicate that left the row's statistic as it was
    EVICTED = "evicted"  # inserted, then evicted at once because the task is full of better ones


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                                     ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]


def comment_columns(code: str) -> dict[int, int]:
    """0-based line index -> column where a Python `#` comment starts (found by the tokenizer, so a '#'
    inside a string is not a comment). For code that does not tokenize to the end, the comments found
    before the error are returned, plus every later line whose first non-blank character is '#'."""
    cuts: dict[int, int] = {}
    last_row = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            last_row = tok.start[0]
            if tok.type == tokenize.COMMENT:
                cuts[tok.start[0] - 1] = tok.start[1]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        for i, line in enumerate(code.splitlines()):
            if i >= last_row - 1 and line.lstrip().startswith("#"):
                cuts[i] = line.index("#")
    return cuts


def _strip_comments_text(code: str) -> str:
    """Remove `#` comments, trailing whitespace and blank lines (for code that does not parse)."""
    cuts = comment_columns(code)
    lines = [line[:cuts[i]] if i in cuts else line for i, line in enumerate(code.splitlines())]
    return "\n".join(line.rstrip() for line in lines if line.strip())


def normalize_source(code: str) -> str:
    """A canonical form of `code` for deduplication: no comments, docstrings, blank lines or formatting."""
    try:
        tree = parse_python(code)
    except (SyntaxError, ValueError):
        return _strip_comments_text(code)
    _strip_docstrings(tree)
    return ast.unparse(tree)


def source_hash(code: str) -> str:
    """SHA-256 of the exact source."""
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


def normalized_hash(code: str) -> str:
    """SHA-256 of `normalize_source(code)`: equal for codes that differ only in comments or formatting."""
    return source_hash(normalize_source(code))


class ExemplarDB:
    """Scored candidates per task in an SQLite file (see the module docstring)."""

    def __init__(self, path: str | Path, *, max_per_task: int = DEFAULT_MAX_PER_TASK, statistic: str = "median",
                 context: str | None = None):
        if str(path) == ":memory:" or not str(path):
            raise ValueError("ExemplarDB needs a database file path (each call opens its own connection)")
        if max_per_task < 1:
            raise ValueError(f"max_per_task must be >= 1, got {max_per_task}")
        if statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
        self.path = Path(path)
        self.max_per_task = max_per_task
        self.statistic = statistic
        self.context = context  # the score context listed and counted (None: every context)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as conn, write_transaction(conn):
            columns = {row[1] for row in conn.execute("PRAGMA table_info(exemplars)")}
            if columns and "scores_json" not in columns:  # written before scores were kept: each row's is one
                conn.execute("ALTER TABLE exemplars ADD COLUMN scores_json TEXT NOT NULL DEFAULT '[]'")
            if columns and "context" not in columns:  # written before contexts: a new table (a new key)
                conn.execute("ALTER TABLE exemplars RENAME TO exemplars_before_context")
                conn.execute("DROP INDEX IF EXISTS exemplars_task_score")
            for statement in _SCHEMA:
                conn.execute(statement)
            if columns and "context" not in columns:
                names = ", ".join(_OLD_COLUMNS)
                conn.execute(f"INSERT INTO exemplars({names}) SELECT {names} FROM exemplars_before_context")
                conn.execute("DROP TABLE exemplars_before_context")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = open_connection(self.path)
        try:
            yield conn
        finally:
            conn.close()

    def add(self, task_id: str, code: str, score: float | Sequence[float],
            meta: dict[str, Any] | None = None, *, context: str | None = None) -> AddResult:
        """Store one evaluation of a successful candidate (or several: a sequence of scores) measured in
        `context` (default: the database's, else ''). A duplicate (same normalised source and context) adds its
        score to the row's, whose score becomes their statistic; the row keeps the code and metadata it was
        first stored with.

        `meta` is stored as JSON; its "model" key also fills the model column.
        """
        scores = [float(v) for v in (score if isinstance(score, Sequence) else [score])]
        if not scores or not all(math.isfinite(v) for v in scores):
            raise ValueError(f"exemplar scores must be finite (and at least one), got {score}")
        meta = dict(meta or {})
        norm = normalized_hash(code)
        now_s = time.time()
        ctx = context if context is not None else (self.context or "")
        row = (task_id, ctx, norm, source_hash(code), code, scores, str(meta.get("model", "")),
               json.dumps(meta, sort_keys=True, default=str), now_s, now_s)
        # One write transaction: the read-then-write must not interleave with another writer.
        with self._connect() as conn, write_transaction(conn):
            return self._add_locked(conn, row)

    def _score(self, scores: Sequence[float]) -> float:
        return float(STATISTICS[self.statistic](scores))

    def _add_locked(self, conn: sqlite3.Connection, row: tuple[Any, ...]) -> AddResult:
        task_id, ctx, norm, src_hash, code, new_scores, model, meta_json, created_s, now_s = row
        existing = conn.execute("SELECT id, score, scores_json FROM exemplars WHERE task_id = ? AND context = ? "
                                "AND norm_hash = ?", (task_id, ctx, norm)).fetchone()
        if existing is not None:
            scores = (json.loads(existing[2]) or [existing[1]]) + new_scores
            scores = scores[-MAX_SCORES_KEPT:]
            score = self._score(scores)
            conn.execute("UPDATE exemplars SET score = ?, scores_json = ?, updated_s = ? WHERE id = ?",
                         (score, json.dumps(scores), now_s, existing[0]))
            if score > existing[1]:
                return AddResult.IMPROVED
            return AddResult.LOWERED if score < existing[1] else AddResult.DUPLICATE
        scores = new_scores[-MAX_SCORES_KEPT:]
        cursor = conn.execute("INSERT INTO exemplars(task_id, context, norm_hash, source_hash, code, score, "
                              "scores_json, model, meta_json, created_s, updated_s) "
                              "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              (task_id, ctx, norm, src_hash, code, self._score(scores), json.dumps(scores), model,
                               meta_json, created_s, now_s))
        new_id = cursor.lastrowid
        evicted = self._evict(conn, task_id, ctx)
        return AddResult.EVICTED if new_id in evicted else AddResult.INSERTED

    def _evict(self, conn: sqlite3.Connection, task_id: str, context: str) -> set[int]:
        """Drop the lowest-scored rows of a context beyond `max_per_task` (oldest first among equal scores)."""
        rows = conn.execute("SELECT id FROM exemplars WHERE task_id = ? AND context = ? ORDER BY score ASC, id ASC",
                            (task_id, context)).fetchall()
        excess = len(rows) - self.max_per_task
        if excess <= 0:
            return set()
        doomed = [r[0] for r in rows[:excess]]
        conn.executemany("DELETE FROM exemplars WHERE id = ?", [(i,) for i in doomed])
        logger.debug("evicted %d exemplars of task %s", len(doomed), task_id)
        return set(doomed)

    def _where(self, task_id: str) -> tuple[str, tuple[Any, ...]]:
        if self.context is None:
            return "task_id = ?", (task_id,)
        return "task_id = ? AND context = ?", (task_id, self.context)

    def list(self, task_id: str) -> list[ScoredCode]:
        """All exemplars of a task (of the database's context, when it has one), best score first (ties: oldest
        first). Each one's `meta["scores"]` holds the scores of its evaluations (most recent last), and
        `meta["context"]` what measured them."""
        where, args = self._where(task_id)
        with self._connect() as conn:
            rows = conn.execute("SELECT id, code, score, model, meta_json, created_s, source_hash, norm_hash, "
                                f"scores_json, context FROM exemplars WHERE {where} ORDER BY score DESC, id ASC",
                                args).fetchall()
        return [_row_to_scored(task_id, r) for r in rows]

    def copy_from(self, other: ExemplarDB, task_ids: Sequence[str], **meta: Any) -> int:
        """Add every exemplar of `other` for `task_ids` (of its context, when it has one), with all its
        evaluations' scores, in their own contexts (and `meta`); returns how many rows were added or rescored."""
        added = 0
        for task_id in task_ids:
            for row in other.list(task_id):
                keep = {k: v for k, v in row.meta.items() if k not in _ROW_KEYS}
                self.add(task_id, row.code, row.meta["scores"], {**keep, **meta}, context=row.meta["context"])
                added += 1
        return added

    def best(self, task_id: str) -> ScoredCode | None:
        """The best-scored exemplar of a task, or None when it has none."""
        rows = self.list(task_id)
        return rows[0] if rows else None

    def count(self, task_id: str) -> int:
        """Number of distinct exemplars stored for a task (of the database's context, when it has one)."""
        where, args = self._where(task_id)
        with self._connect() as conn:
            return int(conn.execute(f"SELECT COUNT(*) FROM exemplars WHERE {where}", args).fetchone()[0])

    def tasks(self) -> list[str]:
        """Task ids that have at least one exemplar, sorted."""
        with self._connect() as conn:
            return [r[0] for r in conn.execute("SELECT DISTINCT task_id FROM exemplars ORDER BY task_id")]


#: The keys `list` fills in from the row itself (not the stored metadata).
_ROW_KEYS = ("id", "task_id", "created_s", "source_hash", "norm_hash", "scores", "evaluations", "context")


def _row_to_scored(task_id: str, row: tuple[Any, ...]) -> ScoredCode:
    row_id, code, score, model, meta_json, created_s, src_hash, norm, scores_json, context = row
    scores = json.loads(scores_json or "[]") or [float(score)]
    meta = json.loads(meta_json or "{}")
    meta.update({"id": row_id, "task_id": task_id, "model": model, "created_s": created_s,
                 "source_hash": src_hash, "norm_hash": norm, "scores": scores, "evaluations": len(scores),
                 "context": context})
    return ScoredCode(code=code, score=float(score), meta=meta)
