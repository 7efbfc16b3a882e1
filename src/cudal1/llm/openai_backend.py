"""Completions from any OpenAI-compatible chat server (vLLM, SGLang, DeepSeek, OpenAI) via `openai.AsyncOpenAI`.

Requests run concurrently under an `asyncio.Semaphore` (`LLMConfig.concurrency`). Retries are done here,
not by the client (`max_retries=0`), so that they are counted in `UsageStats` and testable: 429, 5xx,
timeouts, connection errors and malformed replies are retried with exponential backoff and jitter; a
server's `Retry-After` (seconds or HTTP date, capped at `backoff_max_s`) replaces the computed delay. Other
errors (400, 401, 404, ...) fail at once. A request that still fails gives a `Completion` with `error`
set; it never raises, so one bad request never loses a batch.

Limits: no streaming; the per-request time limit covers the whole request (`timeout_s`), not each byte.
`n` samples are sent as n requests unless `use_n_param` asks for one request with `n`. With a config
`seed`, request k of the backend's life gets seed + k (reproducible runs, fresh samples on every call); a
per-call `seed=` gives that call's requests seed, seed + 1, ... The concurrency limit is per event loop,
shared by concurrent `agenerate` calls.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import re
import threading
import time
import weakref
from typing import Any

from cudal1.core.errors import ConfigError, MissingDependencyError
from cudal1.llm.backends import (
    BackendSpec,
    Completion,
    LLMConfig,
    Message,
    Prompt,
    UsageStats,
    as_messages,
    parse_own_spec,
    resolve_api_key,
    resolve_sampling,
    run_sync,
)

logger = logging.getLogger(__name__)

# Rationale: 408/409/425/429 and all 5xx are transient on every OpenAI-compatible server we know of
# (overload, rolling restarts, upstream gateway timeouts); other 4xx mean the request itself is wrong.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))
PLACEHOLDER_API_KEY = "EMPTY"  # local servers (vLLM, SGLang) accept any key; the client refuses none


class _RetryableError(Exception):
    """A transient failure; `retry_after_s` is the server's hint, when it gave one."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError("openai", "llm", "OpenAI-compatible generation") from exc
    return openai


def parse_retry_after_s(headers: Any) -> float | None:
    """Seconds to wait from `Retry-After` (seconds or an HTTP date) or `retry-after-ms`; None if absent."""
    if headers is None:
        return None
    value_ms = headers.get("retry-after-ms")
    if value_ms:
        try:
            return max(0.0, float(value_ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_delay_s(attempt: int, config: LLMConfig, retry_after_s: float | None, rng: random.Random) -> float:
    """Delay before retry number `attempt` (1-based): the server's hint if any, else base * 2^(attempt-1)
    times a jitter factor in [0.5, 1.5), both capped at `backoff_max_s`."""
    if retry_after_s is not None:
        return min(retry_after_s, config.backoff_max_s)
    delay = config.backoff_base_s * (2 ** (attempt - 1)) * (0.5 + rng.random())
    return min(delay, config.backoff_max_s)


_TARGET = re.compile(r"^(?P<model>[^@\s]+)(?:@(?P<url>\S+))?$")


class OpenAIBackend:
    """`LLMBackend` over an OpenAI-compatible chat-completions endpoint."""

    SPEC_FORM = "openai:MODEL[@BASE_URL]"

    @classmethod
    def parse_target(cls, spec: str, target: str) -> BackendSpec:
        """'MODEL' or 'MODEL@http(s)://host:port/v1' (the part of `spec` after 'openai:'); `ConfigError` otherwise.
        Without a base URL the client reads OPENAI_BASE_URL or uses its default."""
        match = _TARGET.match(target)
        if not match:
            raise ConfigError(f"bad LLM spec {spec!r}: expected 'openai:MODEL' or 'openai:MODEL@http://host:port/v1'")
        url = match.group("url")
        if url is not None and not re.match(r"^https?://[^/\s]+", url):
            raise ConfigError(f"bad base URL {url!r} in LLM spec {spec!r}: it must start with http:// or https://")
        return BackendSpec("openai", match.group("model"), url.rstrip("/") if url else None)

    def __init__(self, config: LLMConfig, *, client_factory: Any = None):
        spec = parse_own_spec(type(self), config.spec)  # before the client or the extra is touched
        self.config = config
        self.model = spec.model
        self.base_url = spec.base_url  # None: the client reads OPENAI_BASE_URL or uses its default
        self.usage = UsageStats()
        self._client_factory = client_factory
        if client_factory is None:
            _import_openai()  # without the extra, fail here, before a caller journals failed requests
        self._rng = random.Random(config.seed)  # jitter only
        self._semaphores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._seed_counter = 0
        self._seed_lock = threading.Lock()

    def _make_client(self) -> Any:
        """A fresh `AsyncOpenAI` bound to the running loop (clients must not cross event loops)."""
        if self._client_factory is not None:
            return self._client_factory()
        openai = _import_openai()
        api_key = resolve_api_key(self.config.api_key_env)
        if api_key is None:
            logger.debug("%s is not set; sending a placeholder key", self.config.api_key_env)
        kwargs: dict[str, Any] = {"api_key": api_key or PLACEHOLDER_API_KEY, "max_retries": 0,
                                  "timeout": self.config.timeout_s}
        if self.base_url:
            kwargs["base_url"] = self.base_url
        return openai.AsyncOpenAI(**kwargs)

    def generate(self, prompts: list[Prompt], n: int = 1, **sampling: Any) -> list[list[Completion]]:
        """Blocking wrapper around `agenerate`; works inside or outside a running event loop."""
        return run_sync(lambda: self.agenerate(prompts, n=n, **sampling))

    async def agenerate(self, prompts: list[Prompt], n: int = 1, **sampling: Any) -> list[list[Completion]]:
        """`n` completions for each prompt, in prompt order; failures come back as error completions."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        params = resolve_sampling(self.config, sampling)
        semaphore = self._semaphore()
        per_request = 1 if self.config.use_n_param else n
        seeds = self._seeds(params["seed"], "seed" in sampling, len(prompts) * per_request)
        client = self._make_client()
        try:
            jobs = []
            for i, prompt in enumerate(prompts):
                messages = as_messages(prompt)
                if self.config.use_n_param:
                    jobs.append(self._request(client, semaphore, messages, params, n, seeds[i]))
                else:
                    for j in range(n):
                        jobs.append(self._request(client, semaphore, messages, params, 1, seeds[i * n + j]))
            flat = await asyncio.gather(*jobs)
        finally:
            await _close_client(client)
        results: list[list[Completion]] = []
        if self.config.use_n_param:
            return [list(group) for group in flat]
        for i in range(len(prompts)):
            results.append([c for group in flat[i * n:(i + 1) * n] for c in group])
        return results

    def _semaphore(self) -> asyncio.Semaphore:
        """One concurrency limit per event loop, shared by all concurrent `agenerate` calls on it."""
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.config.concurrency)
        return semaphore

    def _seeds(self, base: int | None, explicit: bool, count: int) -> list[int | None]:
        """Seeds for `count` requests: an explicit per-call seed gives base, base+1, ...; the config seed
        continues a backend-wide counter, so repeated calls draw new samples yet a run is reproducible."""
        if base is None:
            return [None] * count
        if explicit:
            return [base + k for k in range(count)]
        with self._seed_lock:
            start = self._seed_counter
            self._seed_counter += count
        return [base + start + k for k in range(count)]

    async def _request(self, client: Any, semaphore: asyncio.Semaphore, messages: list[Message],
                       params: dict[str, Any], n: int, seed: int | None) -> list[Completion]:
        """One logical request with retries; returns `n` completions (error ones if it finally failed)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": params["temperature"],
                                "top_p": params["top_p"], "max_tokens": params["max_tokens"]}
        if n > 1:
            body["n"] = n
        if seed is not None:
            body["seed"] = seed
        start = time.monotonic()
        attempts = 0
        last_error = ""
        while True:
            attempts += 1
            try:
                async with semaphore:
                    response = await asyncio.wait_for(client.chat.completions.create(**body),
                                                      timeout=self.config.timeout_s)
                completions = self._parse(response, n, time.monotonic() - start)
                self.usage.record(attempts=attempts, prompt_tokens=completions[0].prompt_tokens,
                                  completion_tokens=sum(c.completion_tokens for c in completions))
                return completions
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - classified right below
                retry_after_s, last_error = _classify(exc)
                if retry_after_s is None or attempts > self.config.max_retries:
                    break
                delay_s = backoff_delay_s(attempts, self.config, retry_after_s or None, self._rng)
                logger.info("LLM request failed (%s); retry %d/%d in %.2fs", last_error, attempts,
                            self.config.max_retries, delay_s)
                await asyncio.sleep(delay_s)
        if attempts > self.config.max_retries and retry_after_s is not None:
            last_error = f"{last_error} (gave up after {attempts} attempts)"
        logger.warning("LLM request failed: %s", last_error)
        self.usage.record(attempts=attempts, error=True)
        latency_s = time.monotonic() - start
        return [Completion(text="", model=self.model, latency_s=latency_s, error=last_error) for _ in range(n)]

    def _parse(self, response: Any, n: int, latency_s: float) -> list[Completion]:
        """Completions from a chat-completions response; a reply without choices counts as malformed."""
        choices = list(getattr(response, "choices", None) or [])
        if not choices:
            raise _RetryableError("malformed reply: no choices")
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_total = int(getattr(usage, "completion_tokens", 0) or 0)
        model = str(getattr(response, "model", None) or self.model)
        per_choice = completion_total // len(choices)
        completions = []
        for k, choice in enumerate(sorted(choices, key=lambda c: getattr(c, "index", 0) or 0)):
            message = getattr(choice, "message", None)
            text = getattr(message, "content", None) or ""
            # spread the request's completion tokens over its choices, the remainder on the first
            tokens = per_choice + (completion_total - per_choice * len(choices) if k == 0 else 0)
            completions.append(Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=tokens,
                                          finish_reason=getattr(choice, "finish_reason", None), model=model,
                                          latency_s=latency_s))
        missing = n - len(completions)
        completions += [Completion(text="", model=model, latency_s=latency_s,
                                   error=f"server returned {len(choices)} of {n} choices")] * max(0, missing)
        return completions[:n]


def _classify(exc: BaseException) -> tuple[float | None, str]:
    """(retry hint, message). The hint is None for a permanent error, 0.0 for 'retry with backoff',
    and a positive number of seconds when the server asked for that wait."""
    openai = _import_openai()
    if isinstance(exc, _RetryableError):
        return 0.0, str(exc)
    if isinstance(exc, (asyncio.TimeoutError, openai.APITimeoutError)):
        return 0.0, "request timed out"
    if isinstance(exc, openai.APIStatusError):
        message = f"HTTP {exc.status_code}: {_short(str(exc))}"
        if exc.status_code in RETRYABLE_STATUS:
            hint = parse_retry_after_s(getattr(exc.response, "headers", None))
            return (hint if hint is not None else 0.0), message
        return None, message
    if isinstance(exc, openai.APIConnectionError):
        return 0.0, f"connection error: {_short(str(exc))}"
    if isinstance(exc, (json.JSONDecodeError, openai.APIResponseValidationError)):
        return 0.0, f"malformed reply: {_short(str(exc))}"
    return None, f"{type(exc).__name__}: {_short(str(exc))}"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


async def _close_client(client: Any) -> None:
    close = getattr(client, "close", None)
    if close is None:
        return
    try:
        result = close()
        if asyncio.iscoroutine(result):
            await result
    except Exception:  # noqa: BLE001 - closing must never hide the real result
        logger.debug("closing the OpenAI client failed", exc_info=True)
