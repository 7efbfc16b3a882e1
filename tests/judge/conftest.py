"""Shared fixtures of the judge tests: the exploit corpus and a seeded hack-case database."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cudal1.judge import HackCaseDB

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "candidates"
MANIFEST = CORPUS / "manifest.yaml"


def corpus_entries(kind: str = "exploit") -> list[dict]:
    return [e for e in yaml.safe_load(MANIFEST.read_text())["fixtures"] if e["kind"] == kind]


@pytest.fixture(scope="session")
def seeded_db_path(tmp_path_factory) -> Path:
    """A store file seeded once from the corpus (copied per test by `seeded_db`)."""
    path = tmp_path_factory.mktemp("seeded") / "results.sqlite"
    HackCaseDB(path).seed_from_corpus(MANIFEST)
    return path


@pytest.fixture
def seeded_db(seeded_db_path, tmp_path) -> HackCaseDB:
    import sqlite3

    target = tmp_path / "results.sqlite"
    with sqlite3.connect(seeded_db_path) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    return HackCaseDB(target)
