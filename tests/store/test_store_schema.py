"""Tests of `cudal1.store.schema`: the version table, migrations, and refusing newer files."""

from __future__ import annotations

import sqlite3

import pytest

from cudal1.store import ResultsStore, StoreError, target_version
from cudal1.store import schema as schema_mod


def _versions(path) -> list[int]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")]


def test_new_store_is_at_current_version(tmp_path):
    path = tmp_path / "r.sqlite"
    with ResultsStore(path) as store:
        assert store.schema_version == target_version() == 1
    assert _versions(path) == [1]
    with ResultsStore(path):  # reopening does not re-apply
        pass
    assert _versions(path) == [1]


def test_foreign_file_without_version_is_migrated_and_kept(tmp_path):
    path = tmp_path / "r.sqlite"
    with sqlite3.connect(path) as conn:  # e.g. the exemplar database created its table first
        conn.execute("CREATE TABLE exemplars (task_id TEXT)")
        conn.execute("INSERT INTO exemplars VALUES ('a')")
    with ResultsStore(path) as store:
        assert store.schema_version == 1
        store.put_meta("x", {"y": 1})
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT task_id FROM exemplars").fetchall() == [("a",)]
    assert _versions(path) == [1]


def test_older_version_is_migrated(tmp_path, monkeypatch, sample_result):
    path = tmp_path / "r.sqlite"
    with ResultsStore(path) as store:
        store.put_evaluation(sample_result, task_hash="t", key="k")

    def add_index(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE INDEX evaluations_by_gpu ON evaluations (gpu_name)")

    migrations = {**schema_mod.MIGRATIONS, 2: ("ALTER TABLE evaluations ADD COLUMN note TEXT",), 3: add_index}
    monkeypatch.setattr(schema_mod, "MIGRATIONS", migrations)
    with ResultsStore(path) as store:
        assert store.schema_version == 3
        assert store.get_evaluation("k") is not None  # old rows survive
        conn = store.connect()
        columns = [r[1] for r in conn.execute("PRAGMA table_info(evaluations)")]
        indexes = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")]
        conn.close()
    assert "note" in columns and "evaluations_by_gpu" in indexes
    assert _versions(path) == [1, 2, 3]


def test_failed_migration_leaves_old_version(tmp_path, monkeypatch):
    path = tmp_path / "r.sqlite"
    ResultsStore(path).close()

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x INTEGER)")
        raise RuntimeError("migration bug")

    monkeypatch.setattr(schema_mod, "MIGRATIONS", {**schema_mod.MIGRATIONS, 2: broken})
    with pytest.raises(RuntimeError):
        ResultsStore(path)
    assert _versions(path) == [1]
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'").fetchone() is None


def test_newer_version_is_refused(tmp_path):
    path = tmp_path / "r.sqlite"
    ResultsStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (99, 'future')")
    with pytest.raises(StoreError, match="newer"):
        ResultsStore(path)
