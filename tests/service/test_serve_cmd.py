"""`cudal1 serve` (cudal1.cli.serve_cmd): help, refusing to start without a token, a real start on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from cudal1.cli.main import main
from cudal1.eval.runner_process import FOLDER_PREFIX


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


def test_a_busy_port_is_one_line_before_any_banner(tmp_path):
    """on a busy port serve printed its banner, then uvicorn's error, and exited 3."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "CUDAL1_SERVER_TOKEN": "tok"}
        cmd = [sys.executable, "-m", "cudal1.cli.main", "serve", "--port", str(port), "--device", "cpu",
               "--store", str(tmp_path / "r.sqlite")]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.strip() == (f"error: cannot serve on 127.0.0.1:{port}: Address already in use "
                                   "(another server? choose another --port)")


def test_bad_or_unsafe_options_are_one_line_errors(capsys, monkeypatch):
    monkeypatch.setenv("CUDAL1_SERVER_TOKEN", "tok")
    for argv, words in ((["--port", "99999"], "not a TCP port"),
                        (["--insecure-no-auth", "--host", "0.0.0.0"], "loopback"),
                        (["--memory-gb", "0"], "--memory-gb"),
                        (["--request-timeout-s", "-1"], "--request-timeout-s")):
        assert main(["serve", "--device", "cpu", *argv]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err


def _start_server(tmp_path, *extra: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a temporary folder of its own: a server started by another test at the same time sweeps the shared one
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "CUDAL1_SERVER_TOKEN": "tok", "TMPDIR": str(tmp_path / "tmp")}
    cmd = [sys.executable, "-m", "cudal1.cli.main", "serve", "--port", str(port), "--device", "cpu",
           "--store", str(tmp_path / "r.sqlite"), "--allow-reference-source", "--trials", "2", *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.2)
    return proc, url


def _send_while_running(url: str, answer: list) -> threading.Thread:
    """Send one real evaluation in a thread; return once the server's slot is busy with it."""
    from _service_fakes import TINY_CANDIDATE, TINY_REF

    def send():
        try:
            answer.append(httpx.post(f"{url}/v1/evaluate", headers={"Authorization": "Bearer tok"}, timeout=120,
                                     json={"task_id": "t/add", "source": TINY_CANDIDATE, "reference_source": TINY_REF}))
        except httpx.TransportError as exc:
            answer.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and httpx.get(f"{url}/healthz").json()["busy_slots"] == 0:
        time.sleep(0.05)
    return sender


def test_sigterm_drains_the_running_request_and_leaves_nothing_behind(tmp_path):
    """A real evaluation is running when SIGTERM arrives: it is answered, the server stops within its grace,
    and no runner outlives it."""
    proc, url = _start_server(tmp_path, "--shutdown-grace-s", "60")
    answer: list = []
    try:
        sender = _send_while_running(url, answer)
        proc.terminate()  # SIGTERM while the evaluation runs
        stopped = time.monotonic()
        sender.join(150)
        proc.wait(150)
        assert time.monotonic() - stopped < 60 + 60  # its grace, and a loaded machine's margin to stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert answer and isinstance(answer[0], httpx.Response) and answer[0].status_code == 200, answer
    assert answer[0].json()["status"] == "correct"
    time.sleep(1.0)
    assert [p for p in os.listdir("/proc") if p.isdigit() and _is_runner_of(int(p), proc.pid, tmp_path)] == []


def test_a_killed_server_leaves_no_runner_and_a_restart_cleans_its_folders(tmp_path):
    """Killed together with its reaper (which would clean up at once: tests/eval/test_reaper.py), the server
    leaves folders that its restart removes before serving."""
    proc, url = _start_server(tmp_path)
    answer: list = []
    sender = _send_while_running(url, answer)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _folders_of(tmp_path, proc.pid):
        time.sleep(0.05)  # its runners are starting
    from cudal1.eval.runner_process import process_tree

    for pid in process_tree(proc.pid):
        if b"cudal1.eval.reaper" in open(f"/proc/{pid}/cmdline", "rb").read():
            os.kill(pid, signal.SIGKILL)
    proc.kill()  # SIGKILL: no handler runs
    proc.wait(10)
    sender.join(30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_is_runner_of(int(p), proc.pid, tmp_path) for p in os.listdir("/proc")
                                              if p.isdigit()):
        time.sleep(0.2)
    # No runner outlives it (bubblewrap's idle init may: killed while it set a sandbox up, it had not armed its
    # parent-death signal yet; the restart ends it, below).
    assert [p for p in os.listdir("/proc") if p.isdigit() and _is_runner_of(int(p), proc.pid, tmp_path)
            and not _is_idle_sandbox_init(int(p))] == []
    left = _folders_of(tmp_path, proc.pid)
    assert left  # what the killed server could not clean
    again, url = _start_server(tmp_path)
    try:
        assert httpx.get(f"{url}/healthz").json()["status"] == "ok"
        assert not any(f.exists() for f in left)  # the restart removed them before serving...
        time.sleep(0.5)
        assert [p for p in os.listdir("/proc") if p.isdigit() and _names_any(int(p), left)] == []  # ...and ended
    finally:
        again.terminate()
        again.wait(60)


def _folders_of(tmp_path: Path, pid: int) -> list[Path]:
    return [f for f in (tmp_path / "tmp").glob(FOLDER_PREFIX + "*") if _owner(f) == pid]


def _owner(folder: Path) -> int:
    try:
        return int((folder / "owner").read_text())
    except (OSError, ValueError):
        return -1


def _names_any(pid: int, folders: list[Path]) -> bool:
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False
    return any(str(f).encode() in cmd for f in folders)


def _is_idle_sandbox_init(pid: int) -> bool:
    """bubblewrap as the init of its PID namespace, with no child left."""
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        return False
    return b"bwrap" in cmd.split(b"\0")[0] and not children


def _is_runner_of(pid: int, server_pid: int, tmp_path: Path) -> bool:
    """A runner process still alive that the (now dead) server started: its child, or an orphan (init's child)
    whose command line names the server's own temporary folder (not one another test left)."""
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        if b"cudal1.eval.inside.runner" not in cmd and b"bwrap" not in cmd:
            return False
        parent = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return False
    return parent == server_pid or (parent == 1 and str(tmp_path / "tmp").encode() in cmd)
