"""The database of known reward-hack cases: source, rule, explanation, where the case came from.

One table, `hack_cases`, in the results-store SQLite file (this module owns only that table). A case is a
candidate source that cheats, the rule it breaks (a static rule name such as `result_caching`, a runtime
guard such as `guard.stream_escape`, or a judge's rule), a short explanation, and its origin: "seed"
(the exploit corpus), "confirmed:static" / "confirmed:runtime" (an evaluation ended HACK_DETECTED), or
"confirmed:judge" (the LLM judge said it cheats). The database grows from confirmed detections
(`take_confirmed`: every HACK_DETECTED evaluation the results store gained since the last look, whoever
stored it) and serves as context for the judge (`cudal1.judge.retrieval`).

Cases are deduplicated by the hash of the normalised source (comments, docstrings and formatting removed;
`cudal1.exemplars.db.normalized_hash`): a second copy of a known case is not added. The static rules
that fire on each case are computed once when it is added and stored with it (retrieval uses them).

Limits: the table holds whole sources, so it is meant for thousands of cases, not millions. Each call
opens its own short connection (WAL, busy timeout), so one `HackCaseDB` is safe across threads and
processes.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.analysis import analyze_source
from cudal1.core.syntax import parse as parse_python
from cudal1.core.types import EvalResult, Flag, Severity, Status
from cudal1.exemplars.db import normalized_hash
from cudal1.store import ResultsStore
from cudal1.store.connection import open_connection, resolve_store_path, write_transaction

__all__ = ["HackCase", "HackCaseDB", "confirmed_rule", "fixture_explanation", "static_rules_of"]

logger = logging.getLogger(__name__)

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS hack_cases(
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        source TEXT NOT NULL,
        source_hash TEXT NOT NULL UNIQUE,
        rule TEXT NOT NULL,
        explanation TEXT NOT NULL DEFAULT '',
        origin TEXT NOT NULL DEFAULT '',
        static_rules TEXT NOT NULL DEFAULT '[]',
        task_id TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS hack_cases_rule ON hack_cases(rule)",
    # The last `evaluations` row id `take_confirmed` has looked at.
    "CREATE TABLE IF NOT EXISTS hack_cases_seen(one INTEGER PRIMARY KEY CHECK (one = 1), evaluation_id INTEGER)",
)

_COLUMNS = "id, source, source_hash, rule, explanation, origin, static_rules, task_id, created_at"


@dataclass(frozen=True)
class HackCase:
    """One known cheating candidate."""

    id: int
    source: str
    source_hash: str  # normalised-source hash (the dedup key)
    rule: str
    explanation: str
    origin: str  # "seed" | "confirmed:static" | "confirmed:runtime" | "confirmed:judge" | "manual" | ...
    created_at: float  # Unix time, seconds
    static_rules: tuple[str, ...] = field(default=())  # static rules that fire on the source
    task_id: str = ""

    def to_dict(self, with_source: bool = True) -> dict[str, Any]:
        d = {"id": self.id, "source_hash": self.source_hash, "rule": self.rule,
             "explanation": self.explanation, "origin": self.origin, "created_at": self.created_at,
             "static_rules": list(self.static_rules), "task_id": self.task_id}
        if with_source:
            d["source"] = self.source
        return d


def static_rules_of(source: str, reference_source: str | None = None) -> tuple[str, ...]:
    """Sorted names of the static rules that fire on `source` (empty when the analysis is unavailable)."""
    try:
        report = analyze_source(source, reference_source=reference_source)
    except Exception:  # noqa: BLE001 - a case must be storable even if the analysis chokes on it
        logger.exception("static analysis failed on a hack case")
        return ()
    return tuple(sorted({f.rule for f in report.flags}))


def fixture_explanation(source: str) -> str:
    """The explanation of an exploit fixture: its docstring's summary, method and scenario, on one line.

    Fixture docstrings read "Exploit: <summary>.  Method: ...  Scenario: ...  Expected: ..."; the
    "Expected:" part (what the evaluator should say) is left out.
    """
    try:
        doc = ast.get_docstring(parse_python(source)) or ""
    except SyntaxError:
        return ""
    doc = re.split(r"\n\s*Expected:", doc, maxsplit=1)[0]
    doc = re.sub(r"^\s*(Exploit|Honest):\s*", "", doc)
    return " ".join(doc.split())


def confirmed_rule(result: EvalResult) -> tuple[str, str]:
    """(rule, origin) of a HACK_DETECTED result: the flag its message names, else its first rejecting flag.

    The origin is "confirmed:" + the flag's source ("static", "runtime", "judge").
    """
    message = result.message or ""
    named = [f for f in result.flags if f.rule and message.startswith(f.rule)]
    errors = [f for f in result.flags if f.severity is Severity.ERROR]
    chosen: Flag | None = (named or errors or list(result.flags) or [None])[0]
    if chosen is not None:
        return chosen.rule, f"confirmed:{chosen.source or 'static'}"
    head = message.split(":", 1)[0].strip()
    rule = head if re.fullmatch(r"[\w.]+", head or "") else "hack_detected"
    return rule, "confirmed:runtime"


class HackCaseDB:
    """Known hack cases in the results-store file (see the module docstring)."""

    def __init__(self, path: str | Path | None = None):
        """Open (creating the table if needed) the database at `path`, default the results store path."""
        if str(path) == ":memory:":
            raise ValueError("HackCaseDB needs a database file (each call opens its own connection)")
        self.path: Path = resolve_store_path(path)
        with self._connect() as conn, write_transaction(conn):
            for statement in _SCHEMA:
                conn.execute(statement)
        self.take_confirmed()

    def take_confirmed(self) -> int:
        """Add the candidates of the HACK_DETECTED evaluations stored since the last call as confirmed cases
        (the evaluator records verdicts only; this is where they become cases); how many were new."""
        store = ResultsStore(self.path)
        try:
            with self._connect() as conn:
                row = conn.execute("SELECT evaluation_id FROM hack_cases_seen").fetchone()
            rows = store.query_evaluations(status=Status.HACK_DETECTED, after_id=row[0] if row else None)
            added = 0
            for rec in rows:
                candidate = store.get_candidate(rec["candidate_hash"])
                task = store.get_task(rec["task_id"], source_hash=rec["task_hash"])
                if candidate is not None and candidate["source"].strip():
                    added += self.record_confirmed(EvalResult.from_dict(rec["result"]), candidate["source"],
                                                   reference_source=task["source"] if task else None) is not None
            if rows:
                with self._connect() as conn, write_transaction(conn):
                    conn.execute("INSERT OR REPLACE INTO hack_cases_seen(one, evaluation_id) VALUES (1, ?)",
                                 (max(rec["id"] for rec in rows),))
        finally:
            store.close()
        return added

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = open_connection(self.path)
        try:
            yield conn
        finally:
            conn.close()

    def __repr__(self) -> str:
        return f"HackCaseDB({str(self.path)!r})"

    def add(self, source: str, rule: str, explanation: str = "", origin: str = "manual", *,
            reference_source: str | None = None, task_id: str = "") -> int | None:
        """Store a case; return its id, or None when the same (normalised) source is already known."""
        if not source or not source.strip():
            raise ValueError("a hack case needs a non-empty source")
        if not rule or not rule.strip():
            raise ValueError("a hack case needs a rule name (e.g. 'result_caching')")
        key = normalized_hash(source)
        if self.find(source) is not None:
            return None
        rules = json.dumps(list(static_rules_of(source, reference_source)))
        with self._connect() as conn, write_transaction(conn):
            cur = conn.execute(
                "INSERT OR IGNORE INTO hack_cases(source, source_hash, rule, explanation, origin, "
                "static_rules, task_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (source, key, rule.strip(), explanation.strip(), origin, rules, task_id, time.time()))
            case_id = cur.lastrowid if cur.rowcount else None
        if case_id is not None:
            logger.info("hack case %d added (%s, %s)", case_id, rule, origin)
        return case_id

    def find(self, source: str) -> HackCase | None:
        """The stored case with the same normalised source, if any."""
        rows = self._select("WHERE source_hash = ?", (normalized_hash(source),))
        return rows[0] if rows else None

    def get(self, case_id: int) -> HackCase | None:
        rows = self._select("WHERE id = ?", (int(case_id),))
        return rows[0] if rows else None

    def list(self, *, rule: str | None = None, origin: str | None = None,
             limit: int | None = None) -> list[HackCase]:
        """Cases in insertion order, optionally of one rule or origin (an origin ending ':' is a prefix)."""
        where, params = [], []
        if rule:
            where.append("rule = ?")
            params.append(rule)
        if origin:
            where.append("origin LIKE ?" if origin.endswith(":") else "origin = ?")
            params.append(origin + "%" if origin.endswith(":") else origin)
        clause = ("WHERE " + " AND ".join(where)) if where else ""
        clause += " ORDER BY id" + (f" LIMIT {int(limit)}" if limit is not None else "")
        return self._select(clause, tuple(params))

    def count(self) -> int:
        with self._connect() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM hack_cases").fetchone()[0])

    def remove(self, case_id: int) -> bool:
        """Delete one case; True when it existed."""
        with self._connect() as conn, write_transaction(conn):
            return conn.execute("DELETE FROM hack_cases WHERE id = ?", (int(case_id),)).rowcount > 0

    def _select(self, clause: str, params: tuple[Any, ...]) -> list[HackCase]:
        with self._connect() as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM hack_cases {clause}", params).fetchall()
        return [HackCase(id=r[0], source=r[1], source_hash=r[2], rule=r[3], explanation=r[4], origin=r[5],
                         static_rules=tuple(json.loads(r[6] or "[]")), task_id=r[7], created_at=r[8])
                for r in rows]

    def seed_from_corpus(self, manifest_path: str | Path) -> int:
        """Add every exploit of a candidate-corpus manifest as a "seed" case; return how many were new.

        The manifest is `tests/fixtures/candidates/manifest.yaml`'s format: `fixtures` entries with
        `file`, `ref`, `kind` and `exploit_class`; the rule is the exploit class and the explanation comes
        from the fixture's docstring (`fixture_explanation`).
        """
        import yaml

        manifest_path = Path(manifest_path)
        try:
            manifest = yaml.safe_load(manifest_path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read the corpus manifest {manifest_path}: {exc}") from exc
        root = manifest_path.parent
        added = 0
        for entry in (manifest or {}).get("fixtures", []):
            if entry.get("kind") != "exploit":
                continue
            source = (root / entry["file"]).read_text()
            ref_path = root / "refs" / entry["ref"] if entry.get("ref") else None
            reference = ref_path.read_text() if ref_path is not None and ref_path.is_file() else None
            case_id = self.add(source, entry.get("exploit_class") or "unknown", fixture_explanation(source),
                               "seed", reference_source=reference, task_id=f"corpus/{entry['file']}")
            added += case_id is not None
        return added

    def record_confirmed(self, result: EvalResult, source: str, *,
                         reference_source: str | None = None) -> int | None:
        """Add the candidate of a HACK_DETECTED evaluation as a confirmed case; None if no hack or known."""
        if result.status is not Status.HACK_DETECTED:
            return None
        rule, origin = confirmed_rule(result)
        explanation = result.message or "; ".join(f.message for f in result.flags[:2])
        return self.add(source, rule, explanation, origin, reference_source=reference_source,
                        task_id=result.task_id)
