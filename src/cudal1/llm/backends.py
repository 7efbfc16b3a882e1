"""The LLM backend interface: completions, usage accounting and the config (`make_backend` is in `factory`).

One small protocol (`LLMBackend`) hides where completions come from: an OpenAI-compatible server
(`openai:MODEL@BASE_URL`, see `openai_backend.py`) or a local `transformers` model (`hf:PATH_OR_ID`, see
`hf_backend.py`). A failed request never raises out of `generate`: it comes back as a `Completion` whose
`error` is set, so one bad request never loses a batch.

A spec is 'KIND:TARGET'. This module checks only that form (`split_spec`); each backend class owns the
grammar of its TARGET (`SPEC_FORM`, `parse_target`), and `factory.parse_spec` dispatches on KIND through
the `factory.BACKENDS` table, which this module cannot import (the backends import it).

Limits: keys are never stored in configs, only the *name* of the environment variable that holds one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from cudal1.core.errors import ConfigError

Message = dict[str, str]
# A prompt is a chat (list of {"role", "content"} messages) or a bare string (sent as one user message).
Prompt = list[Message] | str

T = TypeVar("T")


@dataclass(frozen=True)
class Completion:
    """One completion of one prompt. `error` is set (and `text` empty) when the request failed."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None  # "stop" | "length" | ... as reported by the backend
    model: str = ""
    latency_s: float = 0.0  # wall time of the request that produced it (all retries included)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the request succeeded (the text may still hold no usable code)."""
        return self.error is None


@dataclass
class UsageStats:
    """Running totals over a backend's lifetime. Safe to update from several threads."""

    requests: int = 0  # logical requests finished (success or final failure)
    attempts: int = 0  # transport attempts, retries included
    retries: int = 0  # attempts beyond the first, summed over requests
    errors: int = 0  # requests that failed after all retries
    prompt_tokens: int = 0
    completion_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, *, attempts: int, prompt_tokens: int = 0, completion_tokens: int = 0,
               error: bool = False) -> None:
        """Add one finished logical request made of `attempts` transport attempts."""
        with self._lock:
            self.requests += 1
            self.attempts += attempts
            self.retries += max(0, attempts - 1)
            self.errors += int(error)
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, int]:
        """JSON-ready totals."""
        with self._lock:
            return {"requests": self.requests, "attempts": self.attempts, "retries": self.retries,
                    "errors": self.errors, "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens,
                    "total_tokens": self.prompt_tokens + self.completion_tokens}


@dataclass
class LLMConfig:
    """How to reach a model and how to sample from it."""

    spec: str = field(metadata={"help": "Backend and model: 'openai:MODEL@http://host:port/v1', 'openai:MODEL' "
                                        "(base URL from OPENAI_BASE_URL or the client default), or "
                                        "'hf:PATH_OR_ID' (local transformers model)."})
    api_key_env: str = field(default="OPENAI_API_KEY", metadata={
        "help": "Name of the environment variable holding the API key (the key itself is never stored). "
                "Local servers that need no key work with it unset."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature; 0 means greedy."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass, in (0, 1]."})
    max_tokens: int = field(default=8192, metadata={
        "help": "Maximum completion tokens per sample (analysis + design + code need several thousand)."})
    concurrency: int = field(default=16, metadata={
        "help": "OpenAI: requests in flight at once. HF: prompts per generation batch."})
    timeout_s: float = field(default=600.0, metadata={"help": "Per-request time limit in seconds (OpenAI)."})
    batch_time_limit_s: float | None = field(default=None, metadata={
        "help": "HF: stop a generation batch after this many seconds and return what it generated so far "
                "(transformers' max_time; a cut completion ends with finish_reason 'length'). None: no limit."})
    max_retries: int = field(default=5, metadata={
        "help": "Retries after the first attempt on 429, 5xx, timeouts, connection errors, malformed replies."})
    backoff_base_s: float = field(default=1.0, metadata={
        "help": "First retry delay; doubles each retry, with jitter, capped by backoff_max_s."})
    backoff_max_s: float = field(default=60.0, metadata={
        "help": "Longest delay between retries, also the cap on a server's Retry-After."})
    use_n_param: bool = field(default=False, metadata={
        "help": "OpenAI: ask for n samples in one request (the 'n' parameter) instead of n requests. "
                "Not every server supports it; n requests work everywhere."})
    seed: int | None = field(default=None, metadata={
        "help": "Sampling seed for reproducible runs. OpenAI: the k-th request of the backend is sent seed + k. "
                "HF: seeds torch's global RNG once, at the first generation."})

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str) or not self.spec.strip():
            raise ConfigError("LLMConfig.spec is required, e.g. 'openai:MODEL@http://127.0.0.1:8000/v1'")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.batch_time_limit_s is not None and self.batch_time_limit_s <= 0:
            raise ConfigError(f"batch_time_limit_s must be > 0 (or None), got {self.batch_time_limit_s}")
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.backoff_base_s < 0 or self.backoff_max_s < self.backoff_base_s:
            raise ConfigError("set 0 <= backoff_base_s <= backoff_max_s")
        # Only the generic form here: the per-kind grammar lives in the backends table, above this module.
        split_spec(self.spec)


@dataclass(frozen=True)
class BackendSpec:
    """A parsed `LLMConfig.spec`."""

    kind: str  # the key of its backend in `factory.BACKENDS`: "openai" | "hf" | ...
    model: str
    base_url: str | None = None


def split_spec(spec: str) -> tuple[str, str]:
    """Split 'KIND:TARGET' at the first ':' into (KIND, TARGET), both stripped; `ConfigError` when either
    half is empty. Whether KIND is known and TARGET well formed is for `factory.parse_spec` to say."""
    kind, colon, target = spec.strip().partition(":")
    kind, target = kind.strip(), target.strip()
    if not colon or not kind or not target:
        raise ConfigError(f"bad LLM spec {spec!r}: expected 'KIND:TARGET', e.g. 'openai:MODEL@http://host:port/v1' "
                          "or 'hf:PATH_OR_ID'")
    return kind, target


def parse_own_spec(backend_cls: Any, spec: str) -> BackendSpec:
    """`spec` parsed by `backend_cls`'s own grammar, for a backend's constructor.

    The constructor cannot reach the backends table (it imports this module, not the factory), so the kind
    is checked against the one `backend_cls.SPEC_FORM` begins with: a backend handed another kind's spec
    fails here, with a `ConfigError`, before it loads a model or opens a connection.
    """
    kind, target = split_spec(spec)
    own_kind = backend_cls.SPEC_FORM.partition(":")[0]
    if kind != own_kind:
        raise ConfigError(f"{backend_cls.__name__} needs a spec of the form {backend_cls.SPEC_FORM!r}, got {spec!r}")
    return backend_cls.parse_target(spec, target)


def resolve_api_key(env_name: str) -> str | None:
    """The API key from the environment variable `env_name`, or None when it is unset or empty."""
    value = os.environ.get(env_name, "").strip()
    return value or None


@runtime_checkable
class LLMBackend(Protocol):
    """Anything that turns prompts into completions. One list of `n` completions per prompt, in order."""

    model: str
    usage: UsageStats

    def generate(self, prompts: list[Prompt], n: int = 1, **sampling: Any) -> list[list[Completion]]:
        """Blocking generation; sampling overrides (temperature, top_p, max_tokens, seed) are per call."""
        ...

    async def agenerate(self, prompts: list[Prompt], n: int = 1, **sampling: Any) -> list[list[Completion]]:
        """Same as `generate`, for callers already inside an event loop."""
        ...


def as_messages(prompt: Prompt) -> list[Message]:
    """A chat prompt as a list of messages: a bare string becomes one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]


SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "seed")


def resolve_sampling(config: LLMConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """Config sampling values with per-call overrides; unknown keys raise `ConfigError`."""
    unknown = set(overrides) - set(SAMPLING_KEYS)
    if unknown:
        raise ConfigError(f"unknown sampling parameter(s) {sorted(unknown)}; known: {list(SAMPLING_KEYS)}")
    values = {key: getattr(config, key) for key in SAMPLING_KEYS}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return values


def run_sync(make_coro: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from synchronous code, whether or not this thread has a running loop.

    Without a running loop, `asyncio.run` is used. Inside one (a notebook, an async server calling sync
    code), the coroutine runs in a fresh thread with its own loop, and this thread blocks until it is done.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cudal1-llm") as pool:
        return pool.submit(lambda: asyncio.run(make_coro())).result()  # type: ignore[arg-type]
