"""Run a command in a pseudo-terminal of a given width, as in a user's terminal, and read what it showed."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_terminal(
    argv: list[str], columns: int, env: dict[str, str] | None = None, timeout_s: float = 300
) -> tuple[int, str]:
    """(exit code, the screen's text): ANSI codes removed, and of a line redrawn in place (a progress bar)
    only its last state kept."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    environ = {k: v for k, v in (env or os.environ).items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cudal1.cli.main", *argv],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=environ,
        close_fds=True,
    )
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not select.select([leader], [], [], 1.0)[0]:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(max(1.0, deadline - time.monotonic()))
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    lines = [ANSI.sub("", re.split(r"\x1b\[2K|\r", line)[-1]) for line in text.split("\n")]
    return code, "\n".join(lines)
