"""What the TRL and verl adapters share: a completion's text.

Code extraction is `cudal1.llm.extract.extract_completion`; verdict -> reward is `cudal1.core.rewards.reward_of`;
the verdict of a completion without code is `EvalResult.unparseable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or chat messages (the assistant turns' content, joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):
        turns = [m for m in completion if isinstance(m, Mapping)]
        assistant = [m for m in turns if m.get("role") == "assistant"] or turns
        return "\n".join(str(m.get("content") or "") for m in assistant)
    return str(completion)

