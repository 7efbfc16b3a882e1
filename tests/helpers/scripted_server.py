"""A scripted OpenAI-compatible chat-completions server for tests (stdlib only, bound to 127.0.0.1:0).

    with ScriptedOpenAIServer(["first reply", Reply.error(429, retry_after_s=0.05), "third"]) as srv:
        client_base_url = srv.base_url          # "http://127.0.0.1:PORT/v1"
        ...
        srv.requests                            # list of RecordedRequest (JSON body, headers, time)
        srv.max_in_flight                       # most requests handled at the same time

The script is consumed one item per HTTP request, in arrival order: a string (the assistant's content), a
`Reply` (content, HTTP error with optional Retry-After, delay, malformed body, custom usage), or a callable
`(index, body) -> str | Reply` used for every request. When a list runs out, `default` answers.
Usage numbers are fake but deterministic: prompt tokens = characters of all messages, completion tokens =
characters of the content (override per reply with `usage=`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted answer."""

    content: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # sleep before answering (interrupted when the server stops)
    raw_body: bytes | None = None  # sent verbatim instead of the JSON reply (malformed replies)
    usage: dict[str, int] | None = None
    finish_reason: str = "stop"

    @classmethod
    def text(cls, content: str, **kwargs: Any) -> Reply:
        return cls(content=content, **kwargs)

    @classmethod
    def error(cls, status: int, *, retry_after_s: float | None = None, message: str = "scripted error") -> Reply:
        headers = {"Retry-After": f"{retry_after_s:g}"} if retry_after_s is not None else {}
        body = json.dumps({"error": {"message": message, "type": "scripted", "code": status}}).encode()
        return cls(status=status, headers=headers, raw_body=body)

    @classmethod
    def delayed(cls, delay_s: float, content: str = "late") -> Reply:
        return cls(content=content, delay_s=delay_s)

    @classmethod
    def malformed(cls) -> Reply:
        return cls(raw_body=b'{"id": "x", "choices": [ {"message": ')


ScriptItem = str | Reply
Script = list[ScriptItem] | Callable[[int, dict[str, Any]], ScriptItem]


@dataclass(frozen=True)
class RecordedRequest:
    """What the server received."""

    index: int
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    received_s: float  # time.monotonic() at arrival


class ScriptedOpenAIServer:
    """Threaded HTTP server speaking `POST /v1/chat/completions`; a context manager."""

    def __init__(self, script: Script, *, default: ScriptItem = "default reply"):
        self._script = script
        self._default = default
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._next = 0
        self._in_flight = 0
        self.max_in_flight = 0
        self.requests: list[RecordedRequest] = []
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    def __enter__(self) -> ScriptedOpenAIServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        handler = _make_handler(self)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- called from handler threads --
    def _take(self, body: dict[str, Any], path: str, headers: dict[str, str]) -> Reply:
        with self._lock:
            index = self._next
            self._next += 1
            self.requests.append(RecordedRequest(index, path, body, headers, time.monotonic()))
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        if callable(self._script):
            item = self._script(index, body)
        else:
            item = self._script[index] if index < len(self._script) else self._default
        return item if isinstance(item, Reply) else Reply(content=item)

    def _done(self) -> None:
        with self._lock:
            self._in_flight -= 1


def _completion_body(reply: Reply, body: dict[str, Any], index: int) -> bytes:
    n = int(body.get("n") or 1)
    prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
    usage = reply.usage or {"prompt_tokens": prompt_chars, "completion_tokens": len(reply.content) * n,
                            "total_tokens": prompt_chars + len(reply.content) * n}
    payload = {
        "id": f"chatcmpl-scripted-{index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "scripted"),
        "choices": [{"index": i, "message": {"role": "assistant", "content": reply.content},
                     "finish_reason": reply.finish_reason} for i in range(n)],
        "usage": usage,
    }
    return json.dumps(payload).encode()


def _make_handler(server: ScriptedOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # silence stderr logging
            return

        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                body = {"_unparsed": raw.decode(errors="replace")}
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, b'{"error": {"message": "not found"}}', {})
                return
            reply = server._take(body, self.path, {k.lower(): v for k, v in self.headers.items()})
            try:
                if reply.delay_s and server._stop.wait(reply.delay_s):
                    return
                data = reply.raw_body if reply.raw_body is not None else _completion_body(
                    reply, body, len(server.requests))
                self._send(reply.status, data, reply.headers)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout): nothing to answer
            finally:
                server._done()

        def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler
