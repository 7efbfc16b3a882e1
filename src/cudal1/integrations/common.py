"""What the TRL and verl adapters share: completion text, code extraction, and verdict -> reward.

Reward convention (CUDA-L1, design section 5): the speedup over eager for a CORRECT candidate, 0.0 for
every failure. `failure_rewards` overrides it per status (e.g. -1.0 for HACK_DETECTED); a value of None
tells TRL to ignore that sample for this reward function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cudal1.core.types import EvalResult, Status

DEFAULT_FAILURE_REWARD = 0.0


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


def extract_code(text: str) -> tuple[str | None, str | None]:
    """(candidate source, None) or (None, why) from a completion's text (`cudal1.llm.extract`)."""
    from cudal1.llm.extract import extract_completion

    extraction = extract_completion(text)
    return extraction.code, extraction.error


def reward_of(result: EvalResult, failure_rewards: Mapping[Status, float | None] | None = None) -> float | None:
    """Speedup for CORRECT; the configured value (default 0.0) for a failure."""
    if result.status is Status.CORRECT and result.speedup is not None:
        return float(result.speedup)
    table = failure_rewards or {}
    return table.get(result.status, DEFAULT_FAILURE_REWARD)


def unparseable(task_id: str, why: str | None) -> EvalResult:
    """The verdict for a completion without extractable code."""
    return EvalResult(status=Status.UNPARSEABLE, message=why or "no code found", task_id=task_id)
