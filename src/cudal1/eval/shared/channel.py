"""How the trusted parent and its runners talk: one AF_UNIX SOCK_SEQPACKET socket per runner.

Message boundaries are kept and file descriptors (arenas, doorbells) can travel with a message. Messages are
JSON objects (`protocol.py` says which); the parent waits for a reply with a deadline and a periodic `tick`
(the memory watchdog), so a runner that never answers costs its deadline and no more. Tensors travel through
arenas (`arena.py`), and the timed call's own bracket through doorbells (`doorbell.py`).
"""

from __future__ import annotations

import array
import json
import os
import select
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

#: Largest message (bytes of JSON). Compiler logs and kernel lists are trimmed well below this.
MAX_MESSAGE_BYTES = 4 * 2**20
#: How often a waiting parent runs its `tick` (watchdog) while no reply has come.
TICK_S = 0.05


class ChannelClosed(Exception):
    """The other side is gone (the runner exited or was killed)."""


class ChannelTimeout(Exception):
    """No reply within the deadline."""


class ProtocolError(Exception):
    """A message that is not what the protocol allows (too large, not JSON, not an object)."""


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(parent end, child end); the child end is inheritable, to be passed to the runner."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (parent, child):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE_BYTES)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_MESSAGE_BYTES)
    child.set_inheritable(True)
    return parent, child


class Channel:
    """Framed JSON messages (and optional file descriptors) over a SOCK_SEQPACKET socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.last_bytes = 0  # the size of the last message read, and how long `recv` waited for it
        self.last_wait_s = 0.0

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        data = json.dumps(message, separators=(",", ":"), default=str).encode()
        if len(data) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
        try:
            if fds:
                self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise ChannelClosed(str(exc)) from None

    def recv(self, timeout_s: float | None = None, tick: Callable[[], None] | None = None,
             max_fds: int = 0, max_bytes: int | None = None) -> tuple[dict[str, Any], list[int]]:
        """The next message (and the file descriptors sent with it). Waits at most `timeout_s` (None:
        forever), calling `tick()` every `TICK_S` meanwhile; raises ChannelTimeout, ChannelClosed or
        ProtocolError (a message over `max_bytes` or the channel's limit, not JSON, nested beyond what the
        parser takes, or not an object)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        started = time.perf_counter()
        self.last_bytes, self.last_wait_s = 0, 0.0
        while True:
            wait = TICK_S if tick is not None else None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeout(f"no reply within {timeout_s:.1f} s")
                wait = min(wait, left) if wait is not None else left
            ready, _, _ = select.select([self.sock], [], [], wait)
            if ready:
                self.last_wait_s = time.perf_counter() - started  # the ticks in between count as waiting
                break
            if tick is not None:
                tick()
        fd_bytes = socket.CMSG_SPACE(max_fds * array.array("i").itemsize) if max_fds else 0
        try:
            data, ancdata, flags, _ = self.sock.recvmsg(MAX_MESSAGE_BYTES + 1, fd_bytes)
        except (ConnectionResetError, OSError) as exc:
            raise ChannelClosed(str(exc)) from None
        fds = _received_fds(ancdata)
        self.last_bytes = len(data)
        if not data:
            for fd in fds:
                os.close(fd)
            raise ChannelClosed("the other side closed the channel")
        limit = min(max_bytes or MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES)
        try:
            if len(data) > limit or flags & socket.MSG_TRUNC:
                raise ProtocolError(f"a message of {'more than ' if flags & socket.MSG_TRUNC else ''}{len(data)} "
                                    f"bytes exceeds its limit of {limit}")
            try:
                message = json.loads(data)
            except RecursionError:  # the C parser recurses once per level: a deep message ends it here
                raise ProtocolError("the message is nested deeper than the parser takes") from None
            except ValueError:
                raise ProtocolError("the message is not JSON") from None
            if not isinstance(message, dict):
                raise ProtocolError("the message is not a JSON object")
        except ProtocolError:
            for fd in fds:
                os.close(fd)
            raise
        return message, fds

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(data[: len(data) - (len(data) % arr.itemsize)])
            fds.extend(arr)
    return fds
