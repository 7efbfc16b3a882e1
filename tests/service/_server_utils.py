"""Run a reward server on a loopback socket in a background thread (tests only)."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import httpx
import uvicorn

from cudal1.service.server import ServerConfig, create_app

TOKEN = "s3cret-token"


@contextmanager
def running_server(pool, store=None, **config):
    """Yield (base_url, app) of a uvicorn server on 127.0.0.1:<free port>; stop it afterwards. The tests'
    requests carry their own tiny references, so these servers accept them unless told otherwise."""
    cfg = ServerConfig(token=TOKEN, port=0, **{"allow_reference_source": True, **config})
    app = create_app(cfg, pool, store)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", limit_concurrency=None))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    try:
        yield url, app
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
