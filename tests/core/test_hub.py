"""cudal1/core/hub.py: an unreachable hub is told in seconds, and loads inside the block run offline."""

from __future__ import annotations

import os
import socket
import time

import pytest

from cudal1.core.hub import PROXY_VARIABLES, hub_unreachable, offline_if_unreachable


@pytest.fixture
def no_proxy(monkeypatch):
    for name in (*PROXY_VARIABLES, "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_closed_endpoint_is_unreachable_and_an_open_one_is_not(monkeypatch, no_proxy):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    assert "127.0.0.1 cannot be reached" in hub_unreachable()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub_unreachable() is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")  # a proxy: the direct probe would say nothing
    assert hub_unreachable() is None


def test_loads_in_the_block_run_offline_and_the_setting_comes_back(monkeypatch, no_proxy, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    with offline_if_unreachable("someone/some-model") as why:
        assert why and os.environ["HF_HUB_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in os.environ
    with offline_if_unreachable(str(tmp_path)) as why:  # a local folder: nothing to ask the hub
        assert why is None and "HF_HUB_OFFLINE" not in os.environ


def test_an_unknown_hub_id_offline_fails_in_seconds_with_one_line(monkeypatch, no_proxy, capsys):
    """49 s and 45 retry warnings before the error."""
    pytest.importorskip("datasets")
    from cudal1.cli.main import main

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    started = time.monotonic()
    assert main(["tasks", "list", "--source", "hf:nobody/nothing-here"]) == 2
    # The cause, not a wall time (a loaded machine takes seconds to import datasets): one line, no retries
    # (it printed 45 retry warnings over 49 s).
    assert time.monotonic() > started
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot be reached" in err and "hf:PATH.parquet" in err
