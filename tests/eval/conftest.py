"""Fixtures shared by the evaluator tests: fake torch builds, a loopback listener."""

from __future__ import annotations

import socket
import threading

import pytest


@pytest.fixture
def fake_torch_build(monkeypatch, tmp_path):
    """torch's load_inline/load replaced by fakes that compile nothing; returns (cpp_extension, the fake
    load_inline's calls). Hooks installed afterwards wrap the fakes; the real functions come back after the
    test (monkeypatch restores what it replaced, hooks included)."""
    import torch.utils.cpp_extension as ce

    calls = []
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(ce, "load_inline", lambda *a, **k: calls.append(a) or "module")
    monkeypatch.setattr(ce, "load", lambda *a, **k: None)
    return ce, calls


@pytest.fixture
def listener():
    """A loopback TCP server that records every connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    seen: list[bytes] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            seen.append(conn.recv(100))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], seen
    stop.set()
    thread.join()
    server.close()
