"""Stage 1: supervised fine-tuning (TRL `SFTTrainer`) on executable, correct candidates.

Input: a JSONL file (what `cudal1 augment` exports), one example per line, in any of these shapes:
- `{"messages": [...chat...]}`: the last message is the assistant's answer, the rest is the prompt;
- `{"prompt": ..., "completion": ...}`: strings or chat message lists;
- `{"task_id": ..., "code": ...}` (optionally `ref_code`): the prompt is the plain prompt
  (`build_plain_prompt`) for the task's reference (from `ref_code`, else the task looked up in `source`),
  the answer is the code in a python block.
Every example becomes a conversational prompt/completion pair, so the tokenizer's chat template renders it
and the loss covers the completion only (`completion_only_loss`).

Contrastive format (`contrastive_fraction` > 0): stage 3 prompts with CUDA-L1's contrastive prompt, which a
model fine-tuned on plain prompts alone has never seen. A share of the examples that carry a `score` (the
augment export's speedup) and whose task reference is known is shown instead with the contrastive prompt:
up to `exemplars_per_prompt` other examples of the same task that scored *lower*, with their scores (drawn by
the bucket sampler of stage 3), so the target answer is the one that beats them; an answer without the three
sections is wrapped in them (`format_answer`, written from the measured scores). A deterministic hash of each row sends
`eval_fraction` of them to an evaluation split (the evaluation loss is logged).

Run: `cudal1 train sft --config sft.yaml --model PATH --output-dir runs/sft --set dataset=sft.jsonl`.
Limits: rows longer than `max_length` tokens are truncated from the right; one whose completion is cut
away entirely (its prompt alone fills `max_length`) would be dropped by TRL (no loss left): it is left out
before training with a warning, and a run that would keep none is a one-line error naming `max_length`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cudal1.core.errors import ConfigError, MissingDependencyError
from cudal1.exemplars import ScoredCode, make_sampler, normalized_hash
from cudal1.llm.extract import extract_completion
from cudal1.llm.prompts import SECTION_HEADINGS, build_contrastive_prompt, build_plain_prompt
from cudal1.loops.augment import format_answer
from cudal1.tasks import load_tasks
from cudal1.tasks.task import Task
from cudal1.train.common import (
    RunRecorder,
    StageResult,
    fenced,
    make_training_args,
    open_store,
    resolve_resume,
    run_split,
    time_budget_callback,
)
from cudal1.train.config import SFTStageConfig
from cudal1.train.models import load_policy, lora_config, save_trained

logger = logging.getLogger(__name__)

# {"prompt": [messages], "completion": [one assistant message], "task_id": str}, plus what the contrastive
# format needs where a row gives it: "code", "score", "ref" (the task's reference source).
Record = dict[str, Any]


def _as_messages(value: Any, role: str) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return [{"role": str(m.get("role", role)), "content": str(m["content"])} for m in value]
    raise ValueError(f"expected a string or a list of chat messages, got {type(value).__name__}")


def record_from_row(row: dict[str, Any], tasks_by_id: dict[str, Task] | None = None,
                    form: str = "load_inline") -> Record:
    """One SFT record from one exported row (see the module docstring for the accepted shapes)."""
    task_id = str(row.get("task_id", ""))
    task = (tasks_by_id or {}).get(task_id)
    ref = row.get("ref_code") or row.get("task_source") or (task.source if task is not None else None)
    score = row.get("score")
    extra = {"score": float(score) if score is not None else None, "ref": ref}
    if "messages" in row:
        messages = _as_messages(row["messages"], "user")
        if len(messages) < 2 or messages[-1]["role"] != "assistant":
            raise ValueError("`messages` must end with an assistant message after at least one prompt message")
        return {"prompt": messages[:-1], "completion": messages[-1:], "task_id": task_id}
    if "prompt" in row and "completion" in row:
        completion = _as_messages(row["completion"], "assistant")
        return {"prompt": _as_messages(row["prompt"], "user"), "completion": completion, "task_id": task_id,
                "code": extract_completion(completion[-1]["content"]).code, **extra}
    if "code" in row and task_id:
        if not ref:
            raise ValueError(f"task {task_id!r} has no ref_code and is not in the task source")
        return {"prompt": build_plain_prompt(ref, form=form),
                "completion": [{"role": "assistant", "content": fenced(row["code"])}], "task_id": task_id,
                "code": row["code"], **extra}
    raise ValueError("a row needs `messages`, `prompt` + `completion`, or `task_id` + `code`")


def load_sft_records(path: str | Path, tasks: Sequence[Task] | None = None, form: str = "load_inline", *,
                     contrastive_fraction: float = 0.0, exemplars_per_prompt: int = 2) -> list[Record]:
    """All records of a JSONL file (a share of them in the contrastive format, see the module docstring);
    `ConfigError` naming the line of the first bad row."""
    tasks_by_id = {t.id: t for t in tasks or []}
    records = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read SFT dataset {path}: {exc}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(record_from_row(json.loads(line), tasks_by_id, form))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{lineno}: not a line of JSON ({exc.msg}); the dataset is the JSONL "
                              "that `cudal1 augment` writes (sft.jsonl)") from None
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{path}:{lineno}: {exc}") from None
    if not records:
        raise ConfigError(f"SFT dataset {path} has no examples")
    if contrastive_fraction > 0:
        records = contrastive_records(records, contrastive_fraction, exemplars_per_prompt, form)
    return records


def _hash_fraction(*parts: Any) -> float:
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    return int(digest[:8], 16) / 16**8


def contrastive_records(records: Sequence[Record], fraction: float, n: int, form: str) -> list[Record]:
    """`records` with a `fraction` of those that can be (a code, a score and a reference) shown with the
    contrastive prompt: up to `n` lower-scored examples of the same task as exemplars (module docstring)."""
    by_task: dict[str, list[Record]] = {}
    for r in records:
        if r.get("code") and r.get("score") is not None and r.get("ref"):
            by_task.setdefault(r["task_id"], []).append(r)
    out = []
    for r in records:
        pick = _hash_fraction(r.get("task_id"), r.get("code")) < fraction
        if not pick or r not in by_task.get(r.get("task_id", ""), []):
            out.append(r)
            continue
        pool, seen = [], {normalized_hash(r["code"])}
        for other in by_task[r["task_id"]]:
            key = normalized_hash(other["code"])
            if other["score"] < r["score"] and key not in seen:
                seen.add(key)
                pool.append(ScoredCode(other["code"], other["score"]))
        rng = int(_hash_fraction("exemplars", r["task_id"], r["code"]) * 2**31)
        shown = make_sampler("bucket", {"n": n}, rng=rng).sample(pool) if pool else []
        out.append({**r, "prompt": build_contrastive_prompt(r["ref"], shown, form=form),
                    "completion": [{"role": "assistant", "content": contrastive_answer(r, shown)}]})
    return out


def contrastive_answer(record: Record, shown: Sequence[ScoredCode]) -> str:
    """The record's answer with the three sections; an answer that has them already is kept."""
    answer = record["completion"][-1]["content"]
    if all(heading in answer for heading in SECTION_HEADINGS):
        return answer
    analysis = "There is no previous implementation to compare with."
    if shown:
        best = max(shown, key=lambda e: e.score)
        others = ", ".join(f"{e.score:.2f}x" for e in shown if e is not best)
        analysis = (f"The fastest previous implementation reaches {best.score:.2f}x the reference's speed"
                    + (f"; the others shown reach {others}." if others else "."))
    design = f"The implementation below was measured at {record['score']:.2f}x the reference's speed."
    return format_answer(record["code"], analysis=analysis, design=design)


def split_records(records: Sequence[Record], eval_fraction: float) -> tuple[list[Record], list[Record]]:
    """(train, eval) by a hash of each record, so the split is stable across runs and file orders."""
    if eval_fraction <= 0 or len(records) < 2:
        return list(records), []

    def frac(r: Record) -> float:
        digest = hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest()
        return int(digest[:8], 16) / 16**8

    train = [r for r in records if frac(r) >= eval_fraction]
    held = [r for r in records if frac(r) < eval_fraction]
    if not held:  # tiny datasets: hold out the lowest-hash example so the eval loss exists
        lowest = min(records, key=frac)
        held, train = [lowest], [r for r in records if r is not lowest]
    if not train:
        train, held = held[1:], held[:1]
    return train, held


def to_dataset(records: Sequence[Record]) -> Any:
    """A `datasets.Dataset` of prompt/completion columns (task ids and the rest dropped: SFTTrainer needs none)."""
    try:
        from datasets import Dataset
    except ImportError:
        raise MissingDependencyError("datasets", "train", "SFT datasets") from None
    return Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in records])


def fit_sft(model: Any, tokenizer: Any, train: Sequence[Record], held: Sequence[Record], config: Any, *,
            output_dir: str, max_length: int, resume: str | None = None, callbacks: list | None = None,
            extra_args: dict[str, Any] | None = None) -> Any:
    """Run `SFTTrainer` on records; returns the trainer (its `state.log_history` holds the losses).

    Shared by stage 1 and by each round of stage 2. `config` supplies the optimisation fields.
    """
    try:
        from trl import SFTConfig, SFTTrainer
    except ImportError:
        raise MissingDependencyError("trl", "train", "supervised fine-tuning") from None
    if getattr(config, "completion_only_loss", True):
        train = records_that_fit(train, tokenizer, max_length, "training")
        held = records_that_fit(held, tokenizer, max_length, "evaluation", allow_none=True)
    eval_steps = getattr(config, "eval_steps", 0)
    extra = {"max_length": max_length, "completion_only_loss": getattr(config, "completion_only_loss", True),
             "packing": getattr(config, "packing", False), "dataset_num_proc": None,
             "eval_strategy": ("steps" if eval_steps else "no") if held else "no",
             "per_device_eval_batch_size": config.per_device_train_batch_size}
    if held and eval_steps:
        extra["eval_steps"] = eval_steps
    extra.update(extra_args or {})
    args = make_training_args(SFTConfig, _with_output_dir(config, output_dir), **extra)
    trainer = SFTTrainer(model=model, args=args, train_dataset=to_dataset(train),
                         eval_dataset=to_dataset(held) if held else None, processing_class=tokenizer,
                         peft_config=lora_config(config), callbacks=callbacks or [])
    trainer.train(resume_from_checkpoint=resume)
    if held:
        trainer.evaluate()  # logs eval_loss into state.log_history
    return trainer


def prompt_tokens(record: Record, tokenizer: Any) -> int:
    """Tokens of a record's prompt up to where the answer starts: as the chat template renders it for a
    conversational record, as it is for a plain-text one (TRL's prompt-completion format)."""
    prompt = record["prompt"]
    text = prompt if isinstance(prompt, str) else tokenizer.apply_chat_template(prompt, tokenize=False,
                                                                               add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def records_that_fit(records: Sequence[Record], tokenizer: Any, max_length: int, what: str, *,
                     allow_none: bool = False) -> list[Record]:
    """The records whose answer starts within `max_length` tokens (TRL would drop the others after truncation:
    no answer token left to learn from); a warning names how many went, `ConfigError` when none is left."""
    lengths = [prompt_tokens(r, tokenizer) for r in records]
    kept = [r for r, n in zip(records, lengths, strict=True) if n < max_length]
    if len(kept) < len(records):
        shortest = min(n for n in lengths if n >= max_length)
        if not kept and not allow_none:
            raise ConfigError(f"max_length={max_length} leaves no answer token in any of the {len(records)} "
                              f"SFT {what} examples (the shortest prompt alone is {shortest} tokens): set "
                              f"max_length above that, e.g. --set max_length={_roomy(max(lengths))}")
        logger.warning("SFT: %d of %d %s examples left out: their prompts alone fill max_length=%d tokens "
                       "(raise max_length to keep them)", len(records) - len(kept), len(records), what,
                       max_length)
    return kept


def _roomy(prompt_tokens_: int) -> int:
    """A max_length that fits a prompt and leaves room for an answer: a power of two over twice its length."""
    return 1 << (2 * prompt_tokens_).bit_length()


def _with_output_dir(config: Any, output_dir: str) -> Any:
    import dataclasses

    return config if config.output_dir == output_dir else dataclasses.replace(config, output_dir=output_dir)


def loss_curve(log_history: Sequence[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, training loss) pairs from a trainer's log history."""
    return [(int(e["step"]), float(e["loss"])) for e in log_history if "loss" in e and "step" in e]


def run_sft(config: SFTStageConfig, *, model: Any = None, tokenizer: Any = None,
            tasks: Sequence[Task] | None = None, callbacks: list | None = None) -> StageResult:
    """Stage 1 end to end: load data and model, fine-tune, save `<output_dir>/final`, record the run."""
    store = open_store(config.store)
    recorder = RunRecorder("sft", config, store)
    if tasks is None and (config.split != "all" or config.contrastive_fraction > 0 or _needs_tasks(config.dataset)):
        tasks = load_tasks(config.source)
    records = load_sft_records(config.dataset, tasks, config.form, contrastive_fraction=config.contrastive_fraction,
                               exemplars_per_prompt=config.exemplars_per_prompt)
    if config.split != "all":
        records = records_of_split(records, config, tasks or [])
    train, held = split_records(records, config.eval_fraction)
    logger.info("SFT: %d training and %d evaluation examples", len(train), len(held))
    if model is None or tokenizer is None:
        model, tokenizer = load_policy(config.model, config.tokenizer, seed=config.seed)
    budget = time_budget_callback(config.time_budget_s)
    trainer = fit_sft(model, tokenizer, train, held, config, output_dir=config.output_dir,
                      max_length=config.max_length, resume=resolve_resume(config),
                      callbacks=[budget, *(callbacks or [])])
    final = save_trained(trainer, tokenizer, Path(config.output_dir) / "final")
    history = list(trainer.state.log_history)
    curve = loss_curve(history)
    evals = [e["eval_loss"] for e in history if "eval_loss" in e]
    summary = {"train_examples": len(train), "eval_examples": len(held), "steps": trainer.state.global_step,
               "first_loss": curve[0][1] if curve else None, "last_loss": curve[-1][1] if curve else None,
               "eval_loss": evals[-1] if evals else None, "stopped_by_time_budget": budget.stopped_early}
    return recorder.finish(StageResult("sft", config.output_dir, str(final), history, summary))


def records_of_split(records: Sequence[Record], config: SFTStageConfig, tasks: Sequence[Task]) -> list[Record]:
    """The records of the run's split (`run_split`: the file later stages read too); a record without a task
    id cannot be placed and is kept, with a warning."""
    split, path = run_split(config, tasks)
    wanted = split.ids(config.split)
    kept = [r for r in records if not r.get("task_id") or r["task_id"] in wanted]
    unplaced = sum(1 for r in records if not r.get("task_id"))
    logger.info("SFT: %d of %d records in split %r (%s)", len(kept), len(records), config.split, path)
    if unplaced:
        logger.warning("SFT: %d records name no task_id; kept, though the split cannot be checked for them", unplaced)
    if not kept:
        raise ConfigError(_why_no_records(records, config, split.ids("all"), path))
    return kept


def _why_no_records(records: Sequence[Record], config: SFTStageConfig, known: set[str], path: str) -> str:
    """Why no record is in the run's split: ids that --source does not hold, or all in the other split."""
    ids = sorted({r["task_id"] for r in records})
    unknown = [i for i in ids if i not in known]
    head = (f"no SFT records in split {config.split!r}: the dataset's {len(records)} records name {len(ids)} "
            "task(s)")
    if unknown:
        return (f"{head}, {len(unknown)} of them not in --source {config.source} (e.g. {unknown[0]!r}): pass "
                "the --source the dataset was made from, or --split all to train on every record")
    other = "test" if config.split == "train" else "train"
    return (f"{head}, all in the {other} split of {path}: use --split all, or another splits_file or "
            "split_seed")


def _needs_tasks(path: str) -> bool:
    """Whether some row of the dataset needs the task source (code rows without ref_code)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.strip():
                    row = json.loads(line)
                    if "code" in row and not (row.get("ref_code") or row.get("task_source")) \
                            and "messages" not in row and "prompt" not in row:
                        return True
    except (OSError, ValueError):
        return False  # load_sft_records reports the problem with its line number
    return False
