"""`augment`: stage-1 SFT data (CUDA-L1's data augmentation) from several LLMs and from published releases.

For every model and task, `samples` completions are generated (the plain prompt, or the contrastive one
once the exemplar database holds correct candidates of that task, e.g. from an earlier model) and
evaluated. A candidate is kept when it is *correct* and *executable* (it compiled, ran, and its time is
at most `max_slowdown` x the reference's: 1000x in the paper); at most `keep` per task per model (the paper:
2), the fastest distinct ones (duplicates up to comments and formatting count once). `from_release`
imports a JSONL release in CUDA-L1's schema: each published candidate is evaluated here and the correct,
executable ones become examples whose prompt is the plain prompt for the task (in the candidate's form)
and whose answer is a well-formed three-section answer (`format_answer`) around the code. `from_examples`
imports cudal1's own example candidates the same way (those that can run where candidates are evaluated:
the PyTorch-level ones on a CPU): stage-1 data without an LLM or a release, e.g. to train a tiny model on a
laptop.

Output (`export_examples`): `sft.jsonl` and a Hugging Face `datasets.Dataset` saved with `save_to_disk`,
one row per example: `prompt` (chat messages), `completion` (one assistant message), `task_id`, `score`
(speedup over the reference), `model`, `form`, `origin` — TRL SFTTrainer's conversational
prompt-completion format, read as is by `cudal1 train sft`.

Resuming works as in `optimize` (`cudal1.loops.common.RunJournal`): a rerun of the same command does not
ask the models again for samples it already has, and evaluations are served from the results store.

Limits: models are queried one after another (each model's requests run in parallel); the analysis and
design sections of imported release examples are written from the measured facts and the candidate's own
docstring, not by a model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.core.errors import ConfigError, MissingDependencyError
from cudal1.core.syntax import parse as parse_python
from cudal1.core.types import EvalResult, Status
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.exemplars import ExemplarDB, make_sampler, normalized_hash
from cudal1.llm import LLMConfig, build_contrastive_prompt, build_plain_prompt, make_backend, parse_spec
from cudal1.llm.prompts import (
    DEFAULT_PROMPT_TOKEN_BUDGET,
    FORM_CHOICES,
    FORMS,
    SECTION_HEADINGS,
    resolve_form,
)
from cudal1.loops.common import (
    RunJournal,
    SampleRecord,
    detect_form,
    evaluate_records,
    evaluation_device,
    generate_records,
    stable_hash,
)
from cudal1.service.evaluator import Evaluator, make_evaluator
from cudal1.tasks import load_release, load_tasks
from cudal1.tasks.sources import example_candidates
from cudal1.tasks.splits import TaskSplit
from cudal1.tasks.task import Candidate, Task

logger = logging.getLogger(__name__)

# Rationale: CUDA-L1 keeps "executable" candidates: they compile, run, and finish within 1000x the
# reference's time; slower ones are useless as SFT targets even when correct.
DEFAULT_MAX_SLOWDOWN = 1000.0
DEFAULT_KEEP_PER_TASK_PER_MODEL = 2  # the paper: at most 2 snippets per task per model


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class AugmentConfig:
    """Settings of one `augment` run."""

    llms: list[str] = field(default_factory=list, metadata={
        "help": "Model specs, one per model ('openai:MODEL@URL' or 'hf:PATH'); may be empty with from_release."})
    sources: list[str] = field(default_factory=lambda: ["builtin"], metadata={
        "help": "Task sources (builtin, a folder, hf:NAME, jsonl:PATH, FILE.py) for generation."})
    task_ids: list[str] = field(default_factory=list, metadata={"help": "Only these task ids (default: all)."})
    levels: list[int] = field(default_factory=list, metadata={"help": "Only tasks of these levels."})
    max_tasks: int = _f(0, "At most this many tasks (0: no limit).")
    splits_file: str = _f("", "Train/test split JSON as training writes it: only its train tasks are used, so "
                              "held-out tasks never reach stage-1 data (default: every task).")
    samples: int = _f(4, "Completions generated per task per model.")
    keep: int = _f(DEFAULT_KEEP_PER_TASK_PER_MODEL, "At most this many examples kept per task per model.")
    max_slowdown: float = _f(DEFAULT_MAX_SLOWDOWN, "Executable rule: candidate time <= this x reference time.")
    form: str = _f("auto", "Candidate form asked for: auto (raw_cuda where candidates are evaluated on a "
                           "GPU, torch on a CPU), raw_cuda, load_inline, torch or kernel (a JSON launch spec).")
    contrastive: bool = _f(True, "Use the contrastive prompt once the exemplar database has exemplars.")
    from_release: list[str] = field(default_factory=list, metadata={
        "help": "JSONL releases (CUDA-L1 schema) whose candidates are imported after they pass the evaluator."})
    from_examples: bool = _f(False, "Import cudal1's built-in example candidates that can run where "
                                    "candidates are evaluated (PyTorch-level ones on a CPU) after they pass "
                                    "the evaluator.")
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "How candidates are evaluated."})
    out_dir: str = _f("augment_data", "Output folder: sft.jsonl and dataset/ (datasets.save_to_disk).")
    hf_dataset: bool = _f(True, "Also save a Hugging Face dataset (needs `datasets`).")
    temperature: float = _f(1.0, "Sampling temperature of every model.")
    max_tokens: int = _f(8192, "Maximum completion tokens per sample.")
    concurrency: int = _f(16, "Requests in flight per model.")
    max_retries: int = _f(5, "Retries of a failed request (429, 5xx, timeouts).")
    seed: int = _f(0, "Seed of exemplar sampling.")
    run_name: str = _f("", "Name of the run to create or continue (default: derived from the settings).")
    resume: bool = _f(True, "Continue the run an earlier identical command started.")
    exemplar_db: str | None = _f(None, "Exemplar database file (default: the results store's file).")
    prompt_token_budget: int = _f(DEFAULT_PROMPT_TOKEN_BUDGET, "Token budget of a contrastive prompt.")
    label: str = _f("augment", "Label of the stored evaluations.")

    def __post_init__(self) -> None:
        if isinstance(self.eval, dict):
            self.eval = EvalConfig.from_dict(self.eval)
        if not self.llms and not self.from_release and not self.from_examples:
            raise ConfigError("augment needs at least one --llm, --from-release PATH or --from-examples")
        if self.samples < 1 or self.keep < 1:
            raise ConfigError(f"set samples >= 1 and keep >= 1 (got {self.samples} and {self.keep})")
        if self.max_slowdown <= 0:
            raise ConfigError("max_slowdown must be > 0 (the paper: 1000)")
        if self.form not in FORM_CHOICES:
            raise ConfigError(f"unknown form {self.form!r}: choose one of {', '.join(FORM_CHOICES)}")
        for spec in self.llms:
            parse_spec(spec)  # fail early on an unknown or malformed spec
            self.llm_config(spec)

    def llm_config(self, spec: str) -> LLMConfig:
        """The LLMConfig of one model of the run."""
        return LLMConfig(spec=spec, temperature=self.temperature, max_tokens=self.max_tokens,
                         concurrency=self.concurrency, max_retries=self.max_retries)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class AugmentResult:
    """The examples kept, where they were written, and per (model, task) counts."""

    run_id: str
    examples: list[dict[str, Any]]
    stats: list[dict[str, Any]]
    jsonl_path: Path | None = None
    dataset_path: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "examples": len(self.examples), "stats": self.stats,
                "jsonl_path": str(self.jsonl_path) if self.jsonl_path else None,
                "dataset_path": str(self.dataset_path) if self.dataset_path else None}


ProgressFn = Callable[[str, int, int], None]  # (phase, done, total)


def is_executable(result: EvalResult, max_slowdown: float = DEFAULT_MAX_SLOWDOWN) -> bool:
    """Compiled, ran, and took at most `max_slowdown` x the reference's time (needs the timing)."""
    t = result.timing
    return t is not None and t.ref_ms > 0 and t.candidate_ms <= max_slowdown * t.ref_ms


def keepable(result: EvalResult | None, max_slowdown: float) -> bool:
    """Correct and executable: what stage 1 keeps."""
    return result is not None and result.status is Status.CORRECT and is_executable(result, max_slowdown)


def select_kept(records: Sequence[SampleRecord], keep: int, max_slowdown: float) -> list[SampleRecord]:
    """The fastest `keep` distinct correct and executable records (duplicates up to formatting once)."""
    good = [r for r in records if r.code is not None and keepable(r.eval_result, max_slowdown)]
    good.sort(key=lambda r: -(r.speedup or 0.0))
    seen: set[str] = set()
    kept = []
    for record in good:
        digest = normalized_hash(record.code or "")
        if digest in seen:
            continue
        seen.add(digest)
        kept.append(record)
        if len(kept) == keep:
            break
    return kept


def strip_reasoning(text: str) -> str:
    """The completion without a leading `<think>...</think>` block (reasoning is not an SFT target)."""
    return text.rsplit("</think>", 1)[1].strip() if "</think>" in text else text.strip()


_KERNEL_NAME = re.compile(r"__global__\s+(?:__launch_bounds__\([^)]*\)\s*)?void\s+(\w+)")


def format_answer(code: str, *, analysis: str, design: str) -> str:
    """A well-formed contrastive answer: the three sections with their headings, the code in a python block."""
    return (f"{SECTION_HEADINGS[0]}\n{analysis.strip()}\n\n{SECTION_HEADINGS[1]}\n{design.strip()}\n\n"
            f"{SECTION_HEADINGS[2]}\n```python\n{code.rstrip()}\n```\n")


def release_answer(task: Task, code: str, result: EvalResult) -> str:
    """The answer of an imported release example, written from measured facts and the code's docstring."""
    import ast

    kind = result.kernel_class.value.replace("_", " ") if result.kernel_class else "rewritten"
    timing = ""
    if result.timing is not None:
        timing = f" ({result.timing.ref_ms:.4g} ms -> {result.timing.candidate_ms:.4g} ms)"
    analysis = (f"The reference `Model` runs in PyTorch eager mode. This {kind} implementation was measured at "
                f"{(result.speedup or 0.0):.2f}x the reference's speed{timing} and matches its outputs.")
    try:
        doc = ast.get_docstring(parse_python(code)) or ""
    except SyntaxError:
        doc = ""
    kernels = sorted(set(_KERNEL_NAME.findall(code)))
    design = doc.strip() or "Replace the reference's operations in `ModelNew.forward` with a faster equivalent."
    if kernels:
        design += f"\nCUDA kernels: {', '.join(f'`{k}`' for k in kernels)}."
    return format_answer(code, analysis=analysis, design=design)


def example_row(*, prompt: list[dict[str, str]], answer: str, task_id: str, score: float | None, model: str,
                form: str, origin: str) -> dict[str, Any]:
    """One exported example (TRL conversational prompt-completion plus metadata columns)."""
    return {"prompt": [{"role": m["role"], "content": m["content"]} for m in prompt],
            "completion": [{"role": "assistant", "content": answer}], "task_id": task_id,
            "score": float(score) if score is not None else None, "model": model, "form": form, "origin": origin}


def export_examples(rows: Sequence[dict[str, Any]], out_dir: str | Path, *,
                    hf_dataset: bool = True) -> tuple[Path, Path | None]:
    """Write `sft.jsonl` and (with `hf_dataset`) `dataset/` (`datasets.Dataset.save_to_disk`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "sft.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    if not hf_dataset:
        return jsonl, None
    try:
        from datasets import Dataset
    except ImportError:
        raise MissingDependencyError("datasets", "train", "exporting a Hugging Face dataset") from None
    path = out / "dataset"
    Dataset.from_list(list(rows)).save_to_disk(str(path))
    return jsonl, path


def select_tasks(config: AugmentConfig, tasks: Sequence[Task] | None) -> list[Task]:
    """The tasks to generate for: given, else loaded from `config.sources`, filtered by ids, levels and the
    split file's train set."""
    if tasks is None:
        tasks = [t for spec in config.sources for t in load_tasks(spec)]
    allowed = TaskSplit.load(config.splits_file).ids("train") if config.splits_file else None
    chosen = [t for t in tasks if (not config.task_ids or t.id in config.task_ids or t.name in config.task_ids)
              and (not config.levels or t.level in config.levels) and (allowed is None or t.id in allowed)]
    if config.max_tasks > 0:
        chosen = chosen[:config.max_tasks]
    return chosen


def ready_backends(config: AugmentConfig, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """`given` plus the server backends of `config.llms`, made now: one that cannot work (the `llm` extra
    missing) fails before a run is journaled. Local (`hf:`) models load in their turn, one at a time."""
    backends = dict(given or {})
    for spec in config.llms:
        if spec not in backends and parse_spec(spec).kind == "openai":
            backends[spec] = make_backend(config.llm_config(spec))
    return backends


def augment(config: AugmentConfig, *, tasks: Sequence[Task] | None = None, backends: dict[str, Any] | None = None,
            store: Any = None, pool: Any = None, progress: ProgressFn | None = None) -> AugmentResult:
    """Generate, evaluate, keep and export stage-1 examples; see the module docstring.

    `tasks` replaces loading `config.sources`; `backends` maps a spec of `config.llms` to a ready backend
    (default `make_backend`); `store`, `pool` and `progress` ((phase, done, total)) are as in `optimize`.
    """
    # `auto` becomes the form that runs where the candidates are evaluated (recorded so in the run).
    config = dataclasses.replace(config, form=resolve_form(config.form, evaluation_device(config.eval, pool)))
    chosen = select_tasks(config, tasks) if config.llms else []
    if config.llms and not chosen:
        raise ConfigError(f"no tasks selected from {', '.join(config.sources)}")
    run_key = config.run_name or stable_hash({k: v for k, v in config.to_dict().items()
                                              if k not in ("out_dir", "hf_dataset", "resume", "run_name")}
                                             | {"tasks": [t.hash for t in chosen]})
    backends = ready_backends(config, backends)
    journal = RunJournal(store, "augment", run_key, config.to_dict(), resume=config.resume)
    evaluator = make_evaluator("", config.eval, store=store, label=config.label, run_id=journal.run_id, pool=pool)
    rows: list[dict[str, Any]] = []
    stats: list[dict[str, Any]] = []
    generator = _Generator(config, chosen, journal, evaluator, store, progress) if config.llms else None
    try:
        if generator is not None:
            for spec in config.llms:
                model_rows, model_stats = generator.run_model(spec, backends.get(spec))
                rows += model_rows
                stats += model_stats
        for path in config.from_release:
            release_rows, release_stats = import_release(path, config, evaluator, progress=progress)
            rows += release_rows
            stats += release_stats
        if config.from_examples:
            where = evaluation_device(config.eval, pool)
            example_rows, example_stats = import_examples(config, evaluator, where, progress=progress)
            rows += example_rows
            stats += example_stats
    finally:
        evaluator.close()
        if generator is not None:
            generator.close()
    jsonl, dataset = export_examples(rows, config.out_dir, hf_dataset=config.hf_dataset)
    journal.finish({"examples": len(rows), "jsonl": str(jsonl)})
    logger.info("augment: %d examples written to %s", len(rows), jsonl)
    return AugmentResult(run_id=journal.run_id, examples=rows, stats=stats, jsonl_path=jsonl, dataset_path=dataset)


class _Generator:
    """Generation and selection for the models of one run (state shared by the models)."""

    def __init__(self, config: AugmentConfig, tasks: list[Task], journal: RunJournal, evaluator: Evaluator,
                 store: Any, progress: ProgressFn | None):
        self.config, self.tasks, self.journal, self.evaluator = config, tasks, journal, evaluator
        self.progress = progress
        self.by_id = {t.id: t for t in tasks}
        self.device_type = resolve_device(config.eval.device).split(":")[0]
        path = config.exemplar_db or (str(store.path) if store is not None else None)
        self._tmp: Any = None
        if path is None:
            import tempfile

            self._tmp = tempfile.TemporaryDirectory(prefix="cudal1-exemplars-")
            path = str(Path(self._tmp.name) / "exemplars.sqlite")
        self.exemplars = ExemplarDB(path)
        self.sampler = make_sampler("bucket", rng=config.seed)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    def _prompt(self, task: Task, key: str) -> list[dict[str, str]]:
        pool = [e for e in self.exemplars.list(task.id) if e.meta.get("task_hash", task.hash) == task.hash
                and e.meta.get("device_type", self.device_type) == self.device_type] if self.config.contrastive else []
        if not pool:
            return build_plain_prompt(task.source, form=self.config.form)
        self.sampler.rng = random.Random(f"{self.config.seed}:{key}")  # type: ignore[attr-defined]
        return build_contrastive_prompt(task.source, self.sampler.sample(pool, task_id=task.id),
                                        form=self.config.form, token_budget=self.config.prompt_token_budget)

    def run_model(self, spec: str, backend: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Generate, evaluate and select for one model; returns (example rows, per-task stats)."""
        if backend is None:
            backend = make_backend(self.config.llm_config(spec))
        keys = [(task, f"{spec}|{task.id}|s{s}") for task in self.tasks for s in range(self.config.samples)]
        records = {key: self.journal.reusable(key) for _, key in keys}
        todo = [(task, key) for task, key in keys if records[key] is None]
        if todo:
            prompts = [self._prompt(task, key) for task, key in todo]
            for record in generate_records(backend, [k for _, k in todo], prompts, [t.id for t, _ in todo],
                                           self.journal):
                records[record.key] = record
        pending = [records[k] for _, k in keys if records[k] is not None and not self.journal.is_done(k)]
        done_count = [len(keys) - len(pending)]

        def on_verdict(record: SampleRecord, result: EvalResult | None) -> None:
            if result is not None and result.status is Status.CORRECT and result.speedup is not None and record.code:
                task = self.by_id[record.task_id]
                self.exemplars.add(task.id, record.code, float(result.speedup),
                                   {"model": record.model, "task_hash": task.hash, "device_type": self.device_type,
                                    "form": detect_form(record.code), "origin": "augment"})
            self.journal.save(record)
            self.journal.mark_done(record.key)
            done_count[0] += 1
            if self.progress is not None:
                self.progress(f"evaluating {spec}", done_count[0], len(keys))

        evaluate_records(pending, self.by_id, self.evaluator, on_verdict)
        return self._select(spec, [records[k] for _, k in keys if records[k] is not None])

    def _select(self, spec: str, records: list[SampleRecord]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        rows, stats = [], []
        for task in self.tasks:
            mine = [r for r in records if r.task_id == task.id]
            kept = select_kept(mine, self.config.keep, self.config.max_slowdown)
            for record in kept:
                rows.append(example_row(prompt=record.prompt, answer=strip_reasoning(record.text), task_id=task.id,
                                        score=record.speedup, model=record.model or spec, form=self.config.form,
                                        origin=f"generated:{self.journal.run_id}/{record.key}"))
            stats.append({"model": spec, "task_id": task.id, "generated": len(mine),
                          "generation_errors": sum(r.error is not None for r in mine),
                          "correct": sum(r.status == Status.CORRECT.value for r in mine),
                          "kept": len(kept)})
        return rows, stats


def import_release(path: str | Path, config: AugmentConfig, evaluator: Evaluator, *,
                   progress: ProgressFn | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Evaluate a release's candidates; the correct, executable ones become examples (see the module doc)."""

    path = Path(path)
    pairs = [(task, cand) for task, cand in load_release(path) if cand is not None]
    return import_candidates(pairs, path.stem, config, evaluator, progress=progress)


def import_examples(config: AugmentConfig, evaluator: Evaluator, device: str, *,
                    progress: ProgressFn | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """cudal1's example candidates runnable on `device` (PyTorch-level ones on a CPU), as a release's."""
    found = example_candidates("cpu" if device.startswith("cpu") else "cuda")
    pairs = [(task, Candidate(task_id=task.id, source=source, origin=f"builtin example ({form})",
                              label="cudal1-examples")) for task, form, source in found]
    return import_candidates(pairs, "examples", config, evaluator, progress=progress)


def import_candidates(pairs: Sequence[tuple[Task, Candidate]], label: str, config: AugmentConfig,
                      evaluator: Evaluator, *, progress: ProgressFn | None = None
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Evaluate given candidates; the correct, executable ones become examples (see the module doc)."""
    chosen = {task.id for task in select_tasks(config, [task for task, _ in pairs])}  # --task, --level, --max-tasks
    pairs = [(task, cand) for task, cand in pairs if task.id in chosen]
    total = len(pairs)
    started = time.monotonic()

    def on_result(i: int, result: EvalResult) -> None:
        if progress is not None:
            progress(f"importing {label}", i + 1, total)

    results = evaluator.evaluate([(task, cand.source) for task, cand in pairs], on_result=on_result)
    rows, per_task = [], {}
    for (task, cand), result in zip(pairs, results, strict=True):
        entry = per_task.setdefault(task.id, {"model": label, "task_id": task.id, "generated": 0,
                                              "generation_errors": 0, "correct": 0, "kept": 0})
        entry["generated"] += 1
        if result is None or result.status is not Status.CORRECT:
            continue
        entry["correct"] += 1
        if not keepable(result, config.max_slowdown) or entry["kept"] >= config.keep:
            continue
        form = detect_form(cand.source)
        form = form if form in FORMS else config.form
        rows.append(example_row(prompt=build_plain_prompt(task.source, form=form),
                                answer=release_answer(task, cand.source, result), task_id=task.id,
                                score=result.speedup, model=cand.label or label, form=form,
                                origin=f"release:{cand.origin}"))
        entry["kept"] += 1
    logger.info("%s: %d of %d candidates kept (%.1f s)", label, len(rows), total, time.monotonic() - started)
    return rows, list(per_task.values())


__all__ = ["AugmentConfig", "AugmentResult", "augment", "example_row", "export_examples", "format_answer",
           "import_candidates", "import_examples", "import_release", "is_executable", "keepable",
           "release_answer", "select_kept", "strip_reasoning"]
