"""A thin client of the reward server, used by training code on other machines.

    client = RewardClient("http://gpu-box:8765", token=os.environ["CUDAL1_SERVER_TOKEN"])
    result = client.evaluate("builtin/level1/softmax_lastdim", candidate_source)
    results = client.evaluate_batch([(task_id, source), ...])

Busy (429) and server-side (5xx) answers, and connection failures, are retried with exponential backoff
(honouring Retry-After) up to `max_retries` times; other refusals (401 token, 404 task, 413 size, 422
malformed) raise `RewardServerError` at once, since repeating them cannot help.

Limits: synchronous (one request at a time per call; use `evaluate_batch` or threads for parallelism);
a batch larger than the server's `max_batch_items` must be split by the caller (`evaluate_many` does).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Iterable, Sequence
from typing import Any

from cudal1.core.errors import Cudal1Error, MissingDependencyError
from cudal1.core.types import EvalResult

logger = logging.getLogger(__name__)

ENV_URL = "CUDAL1_REWARD_URL"
ENV_TOKEN = "CUDAL1_SERVER_TOKEN"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class RewardServerError(Cudal1Error):
    """The reward server refused a request (or kept failing); `status` is the HTTP status (None: no answer)."""

    def __init__(self, status: int | None, message: str):
        self.status = status
        super().__init__(f"reward server: {message}" + (f" (HTTP {status})" if status else ""))


Item = tuple[str, str] | dict[str, Any]


def _item(item: Item) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    task_id, source = item
    return {"task_id": task_id, "source": source}


class RewardClient:
    """Client of one reward server (see the module docstring)."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 3600.0, max_retries: int = 5,
                 backoff_s: float = 1.0, max_backoff_s: float = 60.0, batch_size: int = 64,
                 transport: Any = None):
        """`transport`: an httpx transport (tests pass `httpx.MockTransport`); default: the network."""
        try:
            import httpx
        except ImportError:
            raise MissingDependencyError("httpx", "dist", "the reward client") from None
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.batch_size = batch_size
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._httpx = httpx
        self._client = httpx.Client(base_url=self.base_url, headers=headers,
                                    timeout=httpx.Timeout(timeout_s, connect=min(30.0, timeout_s)),
                                    transport=transport)

    @classmethod
    def from_env(cls, **kwargs: Any) -> RewardClient:
        """A client for $CUDAL1_REWARD_URL with $CUDAL1_SERVER_TOKEN."""
        url = os.environ.get(ENV_URL)
        if not url:
            raise RewardServerError(None, f"set {ENV_URL} to the reward server's URL (e.g. http://host:8765)")
        return cls(url, token=os.environ.get(ENV_TOKEN) or None, **kwargs)

    def _delay_s(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.max_backoff_s)
            except ValueError:
                pass
        base = min(self.backoff_s * 2**attempt, self.max_backoff_s)
        return base * (0.5 + random.random() / 2)  # jitter so many trainers do not retry in lockstep

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        """Send with retries; the decoded JSON answer, or `RewardServerError`."""
        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                response = self._client.request(method, path, json=body)
            except self._httpx.TransportError as exc:
                last, status, retry_after = f"{type(exc).__name__}: {exc}", None, None
            else:
                if response.status_code < 400:
                    return response.json()
                status, retry_after = response.status_code, response.headers.get("retry-after")
                try:
                    last = str(response.json().get("detail", response.text))
                except ValueError:
                    last = response.text[:300]
                if status not in RETRY_STATUSES:
                    raise RewardServerError(status, last)
            if attempt == self.max_retries:
                raise RewardServerError(status, f"gave up after {attempt + 1} attempts: {last}")
            delay_s = self._delay_s(attempt, retry_after)
            logger.info("reward server %s %s: %s; retrying in %.1f s", method, path, last, delay_s)
            time.sleep(delay_s)
        raise AssertionError("unreachable")

    def evaluate(self, task_id: str, source: str, *, reference_source: str | None = None,
                 label: str = "") -> EvalResult:
        """Evaluate one candidate for a task id (or for `reference_source`, which the server must allow, under
        `request/<task_id>`)."""
        body: dict[str, Any] = {"task_id": task_id, "source": source, "label": label}
        if reference_source is not None:
            body["reference_source"] = reference_source
        return EvalResult.from_dict(self._request("POST", "/v1/evaluate", body))

    def evaluate_batch(self, items: Sequence[Item]) -> list[EvalResult]:
        """Evaluate (task_id, source) pairs (or item dicts) in one request; results in order."""
        data = self._request("POST", "/v1/evaluate_batch", {"items": [_item(i) for i in items]})
        return [EvalResult.from_dict(d) for d in data["results"]]

    def evaluate_many(self, items: Iterable[Item]) -> list[EvalResult]:
        """Like `evaluate_batch`, split into requests of `batch_size` items."""
        items = list(items)
        out: list[EvalResult] = []
        for start in range(0, len(items), self.batch_size):
            out += self.evaluate_batch(items[start:start + self.batch_size])
        return out

    def health(self) -> dict[str, Any]:
        """The server's /healthz answer."""
        return self._request("GET", "/healthz")

    def metrics_text(self) -> str:
        """The server's /metrics text (Prometheus format)."""
        response = self._client.get("/metrics")
        if response.status_code >= 400:
            raise RewardServerError(response.status_code, response.text[:300])
        return response.text

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
