"""Loading from the Hugging Face hub without a network: fail in seconds, not after a minute of retries.

The hub clients (huggingface_hub, transformers, datasets) retry a connection that cannot be made for most
of a minute (measured 2026-12-04: 49 s and 45 warnings for an unknown model id on a machine without a
network) before they fall back to their cache. `offline_if_unreachable(name)` asks once, in at most
`PROBE_TIMEOUT_S`, whether the hub's host answers; when it does not, the load inside the block runs in the
clients' offline mode, in which a cached copy still loads and anything else fails at once.

Not covered: a hub that answers but slowly; a proxy (with `HTTPS_PROXY` or `ALL_PROXY` set the probe is
skipped, since the direct connection it tries says nothing about the proxy's).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

PROBE_TIMEOUT_S = 3.0  # DNS and TCP connect together; a reachable hub answers in well under a second
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
_TRUE = ("1", "true", "yes", "on")


def hub_unreachable(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub's host cannot be reached now, in a few words, or None when it answers or this cannot be
    told (offline mode already on, which the clients honour themselves, or a proxy configured)."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE
    if offline or any(os.environ.get(v) for v in PROXY_VARIABLES):
        return None
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    outcome: list[str | None] = []

    def probe() -> None:  # in a thread: name resolution itself has no timeout
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"{host} cannot be reached ({exc.strerror or exc})")

    thread = threading.Thread(target=probe, daemon=True, name="cudal1-hub-probe")
    thread.start()
    thread.join(timeout_s)
    return outcome[0] if outcome else f"{host} did not answer within {timeout_s:g} s"


@contextlib.contextmanager
def offline_if_unreachable(name: str) -> Iterator[str | None]:
    """Around a load of `name` from the hub: when `name` is no local path and the hub cannot be reached, the
    hub clients run offline inside the block (cached copies load, the rest fails at once). Yields why the
    hub is unreachable (for the caller's error message), or None when the block runs as usual."""
    why = None if Path(name).exists() else hub_unreachable()
    if why is None:
        yield None
        return
    saved = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # what clients imported from now on read
    patched = []  # (module, old value): clients already imported read their constant
    for module_name in ("huggingface_hub.constants", "datasets.config"):
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, "HF_HUB_OFFLINE"):
            patched.append((module, module.HF_HUB_OFFLINE))
            module.HF_HUB_OFFLINE = True
    try:
        yield why
    finally:
        for module, old in patched:
            module.HF_HUB_OFFLINE = old
        if saved is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved
