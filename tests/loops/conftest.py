"""Fixtures of the loop tests: one results store shared by the tests of this folder.

Sharing it is what keeps the folder fast on 2 cores: the few distinct candidates are evaluated once (the
store caches verdicts by task and candidate hash) and every later test reads them back. Each test still
uses its own exemplar database and its own scripted server, so no test depends on another's run.
"""

from __future__ import annotations

import pytest

from cudal1.store import ResultsStore


@pytest.fixture(scope="session")
def shared_store_path(tmp_path_factory):
    return tmp_path_factory.mktemp("loops-store") / "results.sqlite"


@pytest.fixture()
def store(shared_store_path):
    with ResultsStore(shared_store_path) as opened:
        yield opened
