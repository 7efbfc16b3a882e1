"""`cudal1 serve` (cudal1.cli.serve_cmd): help, refusing to start without a token, a real start on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx

from cudal1.cli.main import main


def test_help_lists_the_options(capsys):
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--workers", "--token-file", "--max-body-bytes", "--max-queue", "--store", "--source"):
        assert option in out


def test_refuses_to_start_without_a_token(monkeypatch, capsys):
    monkeypatch.delenv("CUDAL1_SERVER_TOKEN", raising=False)
    assert main(["serve", "--device", "cpu"]) == 2
    assert "token" in capsys.readouterr().err


def test_serves_on_loopback(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "token").write_text("tok\n")
    env = {**os.environ, "CUDAL1_SERVER_TOKEN": ""}
    cmd = [sys.executable, "-m", "cudal1.cli.main", "serve", "--port", str(port), "--device", "cpu",
           "--token-file", str(tmp_path / "token"), "--store", str(tmp_path / "r.sqlite")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url, health = f"http://127.0.0.1:{port}", None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                health = httpx.get(f"{url}/healthz", timeout=1).json()
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert health is not None and health["status"] == "ok" and health["n_devices"] == 1, proc.stderr
        assert httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer tok"}).status_code == 200
        assert httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer bad"}).status_code == 401
    finally:
        proc.terminate()
        proc.wait(20)
    assert (tmp_path / "r.sqlite").exists()
