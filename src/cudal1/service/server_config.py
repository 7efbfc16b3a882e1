"""The reward server's settings (`ServerConfig`): importable without the server's extra (fastapi), so that
the command line can offer them as options."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from cudal1.core.errors import ConfigError

ENV_TOKEN = "CUDAL1_SERVER_TOKEN"


def _h(help: str) -> dict[str, str]:
    return {"help": help}


def is_loopback(host: str) -> bool:
    """Whether `host` binds loopback only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerConfig:
    """Settings of the reward server."""

    host: str = field(default="127.0.0.1", metadata=_h("Address to bind (loopback by default)."))
    port: int = field(default=8765, metadata=_h("Port to bind (0: any free port)."))
    token: str | None = field(default=None, repr=False, metadata=_h(f"Bearer token; default ${ENV_TOKEN}."))
    token_file: str | None = field(default=None, metadata=_h("File holding the bearer token."))
    insecure_no_auth: bool = field(default=False, metadata=_h("Serve without a token (tests, trusted hosts)."))
    max_body_bytes: int = field(default=8 * 2**20, metadata=_h("Largest request body accepted (413 beyond)."))
    max_queue: int = field(default=256, metadata=_h("Items admitted at once, queued or running (429 beyond)."))
    max_batch_items: int = field(default=64, metadata=_h("Items in one evaluate_batch request."))
    retry_after_s: int = field(default=5, metadata=_h("Retry-After sent with 429."))
    sources: tuple[str, ...] = field(default=("builtin",), metadata=_h("Task sources resolving task ids."))
    allow_reference_source: bool = field(default=False, metadata=_h(
        "Accept a reference module in requests (run sandboxed, stored under request/<task_id>)."))
    request_timeout_s: float = field(default=1800.0, metadata=_h(
        "A request's answer within this (504 beyond, and its work cancelled if not started)."))
    shutdown_grace_s: float = field(default=30.0, metadata=_h(
        "On SIGTERM, how long running requests may finish before the server stops."))

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024 or self.max_queue < 1 or self.max_batch_items < 1:
            raise ConfigError("need max_body_bytes >= 1024, max_queue >= 1 and max_batch_items >= 1")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is not a TCP port (0 to 65535)")
        if self.request_timeout_s <= 0 or self.shutdown_grace_s < 0:
            raise ConfigError("need request_timeout_s > 0 and shutdown_grace_s >= 0")
        if self.insecure_no_auth and not is_loopback(self.host):
            raise ConfigError(f"--insecure-no-auth serves only on a loopback address, not {self.host}: anyone who "
                              "reaches the port could run code on this machine's GPUs; use a token")

    def resolve_token(self) -> str | None:
        """The token: `token`, else the contents of `token_file`, else $CUDAL1_SERVER_TOKEN.

        Raises `ConfigError` when there is none and `insecure_no_auth` is off.
        """
        token = self.token
        if not token and self.token_file:
            try:
                token = Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read the token file {self.token_file}: {exc}") from None
        token = token or os.environ.get(ENV_TOKEN, "").strip() or None
        if token is None and not self.insecure_no_auth:
            raise ConfigError(f"the reward server needs a token: --token-file FILE or ${ENV_TOKEN} "
                              "(or --insecure-no-auth on a trusted host)")
        return token
