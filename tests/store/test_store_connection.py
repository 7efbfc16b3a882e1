"""Tests of `cudal1.store.connection`: store paths, bad inputs, and connection settings."""

from __future__ import annotations

import os
import sqlite3

import pytest

from cudal1.core.errors import Cudal1Error
from cudal1.store import ENV_STORE_PATH, ResultsStore, StoreError, default_store_path
from cudal1.store.connection import is_lock_error, retry_on_lock


def _assert_one_line(exc: pytest.ExceptionInfo, needle: str) -> None:
    text = str(exc.value)
    assert "\n" not in text
    assert needle in text


def test_store_error_is_a_cudal1_error():
    assert issubclass(StoreError, Cudal1Error)


def test_default_path_and_env_override(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_STORE_PATH, raising=False)
    default = default_store_path()
    assert default.name == "results.sqlite" and "cudal1" in default.parent.as_posix()

    target = tmp_path / "env" / "store.sqlite"
    monkeypatch.setenv(ENV_STORE_PATH, str(target))
    assert default_store_path() == target
    with ResultsStore() as store:
        assert store.path == target
        store.put_meta("k", {"v": 1})
    assert target.is_file()


def test_missing_directories_are_created(tmp_path):
    path = tmp_path / "a" / "b" / "c" / "r.sqlite"
    with ResultsStore(path) as store:
        store.put_meta("k", {})
    assert path.is_file()


def test_directory_path_is_refused(tmp_path):
    with pytest.raises(StoreError) as exc:
        ResultsStore(tmp_path)
    _assert_one_line(exc, str(tmp_path))


def test_parent_that_is_a_file_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError) as exc:
        ResultsStore(blocker / "r.sqlite")
    _assert_one_line(exc, "r.sqlite")


def test_non_sqlite_file_is_refused_and_untouched(tmp_path):
    path = tmp_path / "notes.txt"
    content = "these are my notes, not a database\n" * 10
    path.write_text(content)
    with pytest.raises(StoreError) as exc:
        ResultsStore(path)
    _assert_one_line(exc, str(path))
    assert path.read_text() == content
    assert not (tmp_path / "notes.txt-wal").exists()


def test_empty_file_becomes_a_store(tmp_path):
    path = tmp_path / "empty.sqlite"
    path.touch()
    with ResultsStore(path) as store:
        store.put_meta("k", {"v": 2})
        assert store.get_meta("k") == {"v": 2}


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root can read any file")
def test_unreadable_file_is_refused(tmp_path):
    path = tmp_path / "r.sqlite"
    ResultsStore(path).close()
    path.chmod(0)
    try:
        with pytest.raises(StoreError) as exc:
            ResultsStore(path)
        _assert_one_line(exc, str(path))
    finally:
        path.chmod(0o600)


def test_connection_settings(store):
    conn = store.connect()
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 60_000
        assert conn.isolation_level is None
    finally:
        conn.close()


def test_retry_on_lock_retries_only_lock_errors(monkeypatch):
    monkeypatch.setattr("cudal1.store.connection.LOCK_RETRY_BASE_DELAY_S", 0.0)
    calls = {"n": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 3:
            raise sqlite3.OperationalError("database is locked")
        return "ok"

    assert retry_on_lock(flaky) == "ok" and calls["n"] == 3

    def always_locked() -> None:
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(StoreError, match="locked"):
        retry_on_lock(always_locked)

    def broken() -> None:
        raise sqlite3.OperationalError("no such table: nope")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        retry_on_lock(broken)
    assert not is_lock_error(ValueError("database is locked"))
