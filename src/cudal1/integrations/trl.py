"""A TRL reward function over any cudal1 evaluator: `make_evaluator(spec)`, a pool, a `RewardClient`, or a
plain callable `(task_id, source) -> EvalResult`.

    from cudal1.service.evaluator import make_evaluator
    from cudal1.integrations.trl import make_trl_reward

    reward = make_trl_reward(make_evaluator("local", EvalConfig()))   # dataset needs a "task_id" column
    trainer = GRPOTrainer(model=..., reward_funcs=[reward], train_dataset=dataset, ...)

TRL calls `reward(completions, **kwargs)` with the batch's completions (strings, or lists of chat messages
for conversational datasets) and every dataset column as a list in `kwargs`. For each completion the code
is extracted (`cudal1.llm.extract`), evaluated for the row's task (all rows of the batch in parallel),
and scored (`cudal1.core.rewards.reward_of`): speedup for CORRECT with a finite positive speedup,
`failure_rewards[status]` otherwise (default 0.0, the paper's "0 for failures"; keys are `Status` or its
string value; a None value makes TRL ignore the sample; UNPARSEABLE completions are never evaluated).
TRL logs the function by its `__name__`.

Tasks: a pool needs `Task` objects, resolved from the task id through `sources` (indexed once), or built
from a `reference_column` holding the reference module; a `RewardClient` sends the ids (and references)
to the server, which resolves them itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from cudal1.core.errors import SourceError
from cudal1.core.rewards import SPEEDUP_ESTIMATES, FailureRewards, check_failure_rewards, reward_of
from cudal1.core.types import EvalResult, Status
from cudal1.integrations.common import completion_text
from cudal1.llm.extract import Extraction, extract_completion
from cudal1.service.evaluator import Evaluator, ServerEvaluator, as_evaluator
from cudal1.tasks.sources import load_tasks
from cudal1.tasks.task import Task

logger = logging.getLogger(__name__)

RewardFn = Callable[..., list[float | None]]


class TaskResolver:
    """Task id (+ optional reference source) -> Task, through task sources indexed on first use."""

    def __init__(self, sources: Sequence[str] = ("builtin",)):
        self.sources = tuple(sources)
        self._index: dict[str, Task] | None = None

    def __call__(self, task_id: str, reference: str | None = None) -> Task:
        if reference:
            return Task(id=task_id, source=reference, origin="dataset")
        if self._index is None:
            self._index = {}
            for spec in self.sources:
                for task in load_tasks(spec):
                    self._index.setdefault(task.id, task)
                    if spec == "builtin":
                        self._index.setdefault(task.name, task)
        task = self._index.get(task_id)
        if task is None:
            raise SourceError(f"no task {task_id!r} in {', '.join(self.sources)}")
        return task


def _evaluator_over(evaluator: Any, config: Any) -> tuple[Evaluator, bool]:
    """(the evaluator interface over what the caller passed, whether it needs `Task` objects resolved here).
    A plain function is called as `fn(task_id, source)`; a reward server resolves ids itself."""
    if callable(evaluator) and not isinstance(evaluator, Evaluator) and not hasattr(evaluator, "submit") \
            and not hasattr(evaluator, "evaluate_batch"):
        return as_evaluator(lambda task, source: evaluator(task.id, source), config), False
    wrapped = as_evaluator(evaluator, config)
    return wrapped, not isinstance(wrapped, ServerEvaluator)


def make_trl_reward(evaluator: Any, *, task_id_column: str = "task_id", reference_column: str | None = None,
                    failure_rewards: FailureRewards | None = None, extract: bool = True,
                    sources: Sequence[str] = ("builtin",), config: Any = None, name: str = "cudal1_speedup",
                    on_result: Callable[[str, str, EvalResult], None] | None = None,
                    speedup_estimate: str = "point") -> RewardFn:
    """A TRL reward function `(completions, **kwargs) -> list[float | None]` (see the module docstring).

    `extract=False` takes each completion's text as the candidate source as is. `on_result(task_id,
    source, result)` sees every verdict (e.g. to feed an exemplar database). `config` is the EvalConfig a
    pool uses (default: the pool's own). `speedup_estimate`: `point` pays the evaluator's speedup, `lower` the
    low end of its 95 % interval (`cudal1.core.rewards`).
    """
    if speedup_estimate not in SPEEDUP_ESTIMATES:
        raise ValueError(f"speedup_estimate: one of {', '.join(SPEEDUP_ESTIMATES)}, not {speedup_estimate!r}")
    check_failure_rewards(failure_rewards)
    resolver = TaskResolver(sources)
    interface, resolve = _evaluator_over(evaluator, config)

    def reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        task_ids = kwargs.get(task_id_column)
        if task_ids is None or len(task_ids) != len(completions):
            raise ValueError(f"the dataset needs a {task_id_column!r} column (one id per completion)")
        references = kwargs.get(reference_column) if reference_column else None
        verdicts: list[EvalResult | None] = [None] * len(completions)
        todo: list[tuple[int, tuple[str, str, str | None]]] = []
        for i, completion in enumerate(completions):
            text = completion_text(completion)
            extraction = extract_completion(text) if extract or not text else Extraction(code=text)
            if extraction.code is None:
                verdicts[i] = EvalResult.unparseable(str(task_ids[i]), extraction.error)
            else:
                todo.append((i, (str(task_ids[i]), extraction.code, references[i] if references else None)))
        def task_of(task_id: str, reference: str | None) -> Task:
            if resolve:
                return resolver(task_id, reference)
            return Task(id=task_id, source=reference or "", origin="dataset" if reference else "")

        judged = interface.evaluate([(task_of(tid, ref), src) for _, (tid, src, ref) in todo])
        for (i, item), result in zip(todo, judged, strict=True):
            result = result or EvalResult(status=Status.INFRA_ERROR, message="not evaluated", task_id=item[0])
            verdicts[i] = result
            if on_result is not None:
                on_result(item[0], item[1], result)
        rewards = [reward_of(v, failure_rewards, speedup_estimate) for v in verdicts if v is not None]
        logger.debug("rewards %s", rewards)
        return rewards

    reward.__name__ = name
    reward.__qualname__ = name
    return reward
