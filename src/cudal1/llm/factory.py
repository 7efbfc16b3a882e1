"""`make_backend`: a backend from its spec. Apart from `backends.py` (the interface the backends build on),
so that the base module never imports its own implementations."""

from __future__ import annotations

from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.llm.backends import LLMBackend, LLMConfig, parse_spec
from cudal1.llm.hf_backend import HFBackend
from cudal1.llm.openai_backend import OpenAIBackend

#: The backends by the kind of their spec (`backends.parse_spec`): a new backend is one entry here.
BACKENDS: dict[str, type[LLMBackend]] = {"openai": OpenAIBackend, "hf": HFBackend}


def make_backend(spec_or_config: str | LLMConfig, **kwargs: Any) -> LLMBackend:
    """Build a backend from a spec string or an `LLMConfig`.

    Extra keyword arguments go to the backend's constructor (for `hf:` that includes `model=` and
    `tokenizer=` to reuse already-built objects, e.g. the policy being trained).
    """
    config = LLMConfig(spec=spec_or_config) if isinstance(spec_or_config, str) else spec_or_config
    if not isinstance(config, LLMConfig):
        raise ConfigError(f"make_backend expects a spec string or an LLMConfig, got {type(config).__name__}")
    return BACKENDS[parse_spec(config.spec).kind](config, **kwargs)
