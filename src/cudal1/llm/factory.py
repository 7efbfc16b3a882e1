"""`make_backend` and `parse_spec`: a backend from its spec, through the `BACKENDS` table. Apart from
`backends.py` (the interface the backends build on), so that the base module never imports its own
implementations."""

from __future__ import annotations

from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.llm.backends import BackendSpec, LLMBackend, LLMConfig, split_spec
from cudal1.llm.hf_backend import HFBackend
from cudal1.llm.openai_backend import OpenAIBackend

#: The backends by the KIND of their 'KIND:TARGET' spec. A new backend is one entry here plus its class,
#: which has `SPEC_FORM` (shown to users; it begins with 'KIND:'), a classmethod
#: `parse_target(spec, target) -> BackendSpec` raising `ConfigError`, and a `(config, **kwargs)` constructor.
BACKENDS: dict[str, Any] = {"openai": OpenAIBackend, "hf": HFBackend}


def spec_forms() -> list[str]:
    """The spec form of every backend in the table, for messages and help texts."""
    return [cls.SPEC_FORM for cls in BACKENDS.values()]


def parse_spec(spec: str) -> BackendSpec:
    """Parse an LLM spec: split 'KIND:TARGET' at the first ':' and let `BACKENDS[KIND]` parse TARGET.

    Raises `ConfigError` when the spec is not 'KIND:TARGET', KIND is not in the table (the message lists
    every form the table accepts) or the backend rejects TARGET.
    """
    kind, target = split_spec(spec)
    backend_cls = BACKENDS.get(kind)
    if backend_cls is None:
        raise ConfigError(f"unknown LLM spec {spec!r}: use " + " or ".join(repr(f) for f in spec_forms()))
    return backend_cls.parse_target(spec, target)


def make_backend(spec_or_config: str | LLMConfig, **kwargs: Any) -> LLMBackend:
    """Build a backend from a spec string or an `LLMConfig`.

    The spec is parsed in full first, so an unknown or malformed one raises `ConfigError` before any model
    is loaded or connection made. Extra keyword arguments go to the backend's constructor (for `hf:` that
    includes `model=` and `tokenizer=` to reuse already-built objects, e.g. the policy being trained).
    """
    config = LLMConfig(spec=spec_or_config) if isinstance(spec_or_config, str) else spec_or_config
    if not isinstance(config, LLMConfig):
        raise ConfigError(f"make_backend expects a spec string or an LLMConfig, got {type(config).__name__}")
    parse_spec(config.spec)
    return BACKENDS[split_spec(config.spec)[0]](config, **kwargs)
