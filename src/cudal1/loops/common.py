"""What the optimize and augment loops share: the resumable run journal, batch evaluation, feedback.

- `RunJournal`: one run per *run key* (a hash of everything that decides what a run generates). It finds
  the run a previous invocation of the same command started (through the store's `meta` table), and keeps
  one `SampleRecord` per generated sample (prompt, completion, verdict) in `meta` under
  `<run id>/<item key>`, plus `mark_done` once a sample is evaluated. A rerun of the same command skips
  done samples, evaluates generated-but-unevaluated ones without asking the LLM again, and generates the
  rest. Without a store the journal lives in memory (nothing resumes).
- `evaluate_records`: the verdicts of a batch of generated records, through the evaluator interface
  (`service.evaluator`: this machine, a pool or a reward server).
- `unparseable_result`: the verdict for a completion without code, stored like any evaluation.
- `feedback_from`: the most useful failure of a batch, as a few lines for the next prompt.

Limits: completions are kept in the store's small key/value table (a few KB each); a journal's records
are read back one key at a time, which is fine for hundreds of samples per run, not for millions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cudal1.core.forms import candidate_form
from cudal1.core.machine import describe_machine
from cudal1.core.types import EvalResult, Status
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.llm import Completion, extract_completion
from cudal1.service.evaluator import Evaluator
from cudal1.tasks.task import Task, source_hash

logger = logging.getLogger(__name__)

GENERATION_ERROR = "generation_error"  # a sample whose LLM request failed (no EvalResult status)
FEEDBACK_MAX_CHARS = 1200  # a compiler error with its source line and caret fits; a whole log does not
# Rationale: a compile error names the line to fix; a runtime error or a mismatch says what went wrong at
# run time; a hack verdict says which rule to stop breaking; a timeout or missing code carry little.
FEEDBACK_PRIORITY = (Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.INCORRECT, Status.HACK_DETECTED,
                     Status.TIMEOUT, Status.UNPARSEABLE)


def stable_hash(value: Any, length: int = 16) -> str:
    """Short sha256 of a JSON-serialisable value (keys sorted): the same inputs give the same name."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def evaluation_device(config: EvalConfig, pool: Any = None) -> str:
    """Where a loop's candidates are evaluated: this machine's device, a local pool's first device, or
    `remote` (a Ray pool or another machine), which `resolve_form` takes for a GPU."""
    if pool is None:
        return resolve_device(config.device)
    devices = getattr(pool, "devices", None)
    return str(devices[0]) if devices else "remote"


def detect_form(source: str) -> str:
    """`kernel`, `load_inline`, `raw_cuda` or `torch` (no CUDA of its own) for a candidate source
    (`cudal1.core.forms.candidate_form`)."""
    return candidate_form(source)


@dataclass
class SampleRecord:
    """One generated sample of a run: what was asked, what came back, and its verdict once evaluated."""

    key: str  # item key within the run, e.g. "r2/s5" or "MODEL|TASK|s3"
    task_id: str
    model: str = ""
    prompt: list[dict[str, str]] = field(default_factory=list)
    text: str = ""  # the completion ("" when the request failed)
    error: str | None = None  # the LLM request's error, when it failed
    code: str | None = None  # the extracted candidate, None when none was found
    status: str | None = None  # an EvalResult status value, GENERATION_ERROR, or None before evaluation
    result: dict[str, Any] | None = None  # EvalResult.to_dict() once evaluated

    @property
    def eval_result(self) -> EvalResult | None:
        return EvalResult.from_dict(self.result) if self.result else None

    @property
    def speedup(self) -> float | None:
        return self.result.get("speedup") if self.result else None

    @property
    def correct(self) -> bool:
        return self.status == Status.CORRECT.value and self.code is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SampleRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class RunJournal:
    """A resumable run: its id in the store, its sample records and which samples are done."""

    def __init__(self, store: Any, kind: str, run_key: str, config: dict[str, Any], *, resume: bool = True):
        self.store = store
        self.kind = kind
        self.run_key = run_key
        self._memory: dict[str, SampleRecord] = {}
        self._done: set[str] = set()
        self.resumed = False
        pointer = f"{kind}:run:{run_key}"
        found = store.get_meta(pointer) if (store is not None and resume) else None
        if found and store.get_run(found.get("run_id", "")) is not None:
            self.run_id = str(found["run_id"])
            self.resumed = True
            self._done = store.done_items(self.run_id)
            logger.info("%s: resuming run %s (%d samples done)", kind, self.run_id, len(self._done))
        elif store is not None:
            self.run_id = store.start_run(kind, config)
            store.put_meta(pointer, {"run_id": self.run_id})
        else:
            self.run_id = f"{kind}-memory-{run_key[:8]}"

    def _meta_key(self, item_key: str) -> str:
        return f"{self.run_id}/{item_key}"

    def load(self, item_key: str) -> SampleRecord | None:
        """The record of a generated sample, or None when it was never generated."""
        if item_key in self._memory:
            return self._memory[item_key]
        if self.store is None:
            return None
        value = self.store.get_meta(self._meta_key(item_key))
        record = SampleRecord.from_dict(value) if value else None
        if record is not None:
            self._memory[item_key] = record
        return record

    def reusable(self, item_key: str) -> SampleRecord | None:
        """The record an earlier invocation generated, or None when the sample is to be generated now: never
        generated, or its request failed (a rerun asks again: the server may be up, the extra installed; a
        failure is no sample, so it never counts as one of a round's)."""
        record = self.load(item_key)
        if record is None or record.error is None:
            return record
        self._memory.pop(item_key, None)
        self._done.discard(item_key)
        if self.store is not None:
            self.store.mark_undone(self.run_id, item_key)
        return None

    def save(self, record: SampleRecord) -> None:
        """Persist a record (after generation, and again after evaluation)."""
        self._memory[record.key] = record
        if self.store is not None:
            self.store.put_meta(self._meta_key(record.key), record.to_dict())

    def mark_done(self, item_key: str) -> None:
        self._done.add(item_key)
        if self.store is not None:
            self.store.mark_done(self.run_id, item_key)

    def is_done(self, item_key: str) -> bool:
        return item_key in self._done

    def finish(self, summary: dict[str, Any]) -> None:
        if self.store is not None:
            self.store.finish_run(self.run_id, summary)


def unparseable_result(task: Task, text: str, why: str | None, config: EvalConfig, *, store: Any = None,
                       label: str = "", run_id: str | None = None) -> EvalResult:
    """The UNPARSEABLE verdict for a completion without code; stored (completion as the candidate) too."""
    device = resolve_device(config.device)
    protocol = config.resolved(device).protocol()
    environment = dict(describe_machine(device))
    digest = source_hash(text)
    result = EvalResult.unparseable(task.id, why, candidate_hash=digest, protocol=protocol, environment=environment)
    if store is not None:
        key = store.eval_key(task.hash, digest, protocol, environment)
        store.record_evaluation(task, text, result, key=key, label=label, run_id=run_id,
                                candidate_origin="unparseable completion")
    return result


def generate_records(backend: Any, keys: Sequence[str], prompts: Sequence[list[dict[str, str]]],
                     task_ids: Sequence[str], journal: RunJournal) -> list[SampleRecord]:
    """Ask `backend` for one completion per prompt (all in parallel) and journal them as records.

    A failed request, or a backend that raises, gives records with `error` set; nothing is raised.
    """
    try:
        completions = backend.generate(list(prompts), n=1)
    except Exception as exc:  # noqa: BLE001 - a broken backend costs these samples, not the run
        logger.warning("generation of %d samples failed: %s: %s", len(prompts), type(exc).__name__, exc)
        completions = [[Completion(text="", error=f"{type(exc).__name__}: {exc}")] for _ in prompts]
    model = str(getattr(backend, "model", ""))
    records = []
    for key, prompt, task_id, group in zip(keys, prompts, task_ids, completions, strict=True):
        completion = group[0]
        record = SampleRecord(key=key, task_id=task_id, model=completion.model or model, prompt=list(prompt),
                              text=completion.text, error=completion.error)
        if completion.error:
            logger.info("%s %s: generation failed: %s", task_id, key, completion.error)
        journal.save(record)
        records.append(record)
    return records


def evaluate_records(records: Sequence[SampleRecord], tasks: Mapping[str, Task], evaluator: Evaluator,
                     on_verdict: Callable[[SampleRecord, EvalResult | None], None], *,
                     should_stop: Callable[[], bool] | None = None) -> None:
    """Give each record its verdict and call `on_verdict(record, result)` with it.

    A failed generation gets status GENERATION_ERROR and result None (no evaluation); a completion without
    code gets the stored UNPARSEABLE verdict; the rest go to `evaluator` in one batch. Records skipped by
    `should_stop` get no call (they stay pending, so a resumed run evaluates them).
    """
    runnable: list[SampleRecord] = []
    for record in records:
        task = tasks[record.task_id]
        if record.error is not None:
            record.status = GENERATION_ERROR
            on_verdict(record, None)
            continue
        extraction = extract_completion(record.text)
        record.code = extraction.code
        if extraction.code is None:
            result = unparseable_result(task, record.text, extraction.error, evaluator.config,
                                        store=evaluator.store, label=evaluator.label, run_id=evaluator.run_id)
            _set_result(record, result)
            on_verdict(record, result)
            continue
        runnable.append(record)

    def on_result(i: int, result: EvalResult) -> None:
        _set_result(runnable[i], result)
        on_verdict(runnable[i], result)

    evaluator.evaluate([(tasks[r.task_id], r.code or "") for r in runnable], on_result=on_result,
                       should_stop=should_stop)


def _set_result(record: SampleRecord, result: EvalResult) -> None:
    record.status = result.status.value
    record.result = result.to_dict()


def _trim(text: str, max_chars: int) -> str:
    text = text.strip()
    return text if len(text) <= max_chars else text[:max_chars - 20].rstrip() + "\n[... trimmed]"


def feedback_from(results: Sequence[EvalResult], *, max_chars: int = FEEDBACK_MAX_CHARS) -> str | None:
    """A few lines about the most informative failure among `results` (see FEEDBACK_PRIORITY), or None."""
    by_status: dict[Status, EvalResult] = {}
    for result in results:
        by_status.setdefault(result.status, result)
    chosen = next((by_status[s] for s in FEEDBACK_PRIORITY if s in by_status), None)
    if chosen is None:
        return None
    lines = [f"One of the previous attempts failed with status {chosen.status.value}."]
    message = (chosen.message or "").strip()
    if message:
        lines.append(message)
    log = (chosen.compile_log or "").strip()
    if log and log not in message:
        lines.append("Compiler output:\n" + log)
    if chosen.mismatch is not None:
        described = chosen.mismatch.describe()
        if described not in message:
            lines.append("Worst mismatch: " + described)
    closing = "Avoid this mistake in the new implementation."
    return _trim("\n".join(lines), max(80, max_chars - len(closing) - 1)) + "\n" + closing


__all__ = ["GENERATION_ERROR", "RunJournal", "SampleRecord", "detect_form", "evaluate_records",
           "feedback_from", "generate_records", "stable_hash", "unparseable_result"]
