"""LLM access for cudal1: backends (OpenAI-compatible servers, local transformers models), prompts, extraction.

Heavy optional dependencies (`openai`, `transformers`) are imported only by the backend that needs them.
"""

from cudal1.llm.backends import (
    BackendSpec,
    Completion,
    LLMBackend,
    LLMConfig,
    UsageStats,
)
from cudal1.llm.extract import Extraction, extract_completion
from cudal1.llm.factory import BACKENDS, make_backend, parse_spec
from cudal1.llm.prompts import (
    FORM_INSTRUCTIONS,
    RESTRICTIONS,
    SECTION_HEADINGS,
    build_contrastive_prompt,
    build_plain_prompt,
    count_prompt_tokens,
)

__all__ = [
    "BACKENDS",
    "BackendSpec",
    "Completion",
    "Extraction",
    "FORM_INSTRUCTIONS",
    "LLMBackend",
    "LLMConfig",
    "RESTRICTIONS",
    "SECTION_HEADINGS",
    "UsageStats",
    "build_contrastive_prompt",
    "build_plain_prompt",
    "count_prompt_tokens",
    "extract_completion",
    "make_backend",
    "parse_spec",
]
