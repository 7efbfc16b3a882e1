"""What the policy wrote during training, as a JSONL file to read: `<output_dir>/completions.jsonl`.

Stages 2 (self-supervised) and 3 (GRPO) write one line per sampled completion when `log_completions` is on
(the default): the stage, the round (stage 2) or optimizer step (stage 3), the task, the completion's text,
whether code was found in it, the evaluator's verdict (`status`, `speedup`, `message`), the reward (stage 3:
`reward` raw, `reward_smoothed` after normalization and clipping, what GRPO saw) or whether it was kept for
fine-tuning (stage 2). Prompts are long and shared (a GRPO group, a task's round): each line names its
prompt by `prompt_sha256`, and the first line of the file with that hash carries the prompt itself
(`prompt`, the chat messages). Read it with `jq` or pandas (`pd.read_json(path, lines=True)`).

TRL's own `log_completions` (a table on the console and in wandb) stays off: completions of thousands of
tokens do not read well there. With several processes (accelerate, torchrun) each writes its own file,
`completions.rank<N>.jsonl` beside rank 0's `completions.jsonl`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cudal1.core.types import EvalResult


class CompletionLog:
    """Appends completion lines to one JSONL file (thread-safe; each prompt's text written once)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        if self.path.is_file():  # a resumed run appends: prompts already in the file are not repeated
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    self._seen.add(json.loads(line).get("prompt_sha256", ""))
                except ValueError:
                    continue

    @classmethod
    def for_run(cls, config: Any, rank: int = 0) -> CompletionLog | None:
        """The log of a stage run (`config.log_completions`, `config.output_dir`), or None when it is off."""
        if not getattr(config, "log_completions", False):
            return None
        name = "completions.jsonl" if rank == 0 else f"completions.rank{rank}.jsonl"
        return cls(Path(config.output_dir) / name)

    def write(self, *, stage: str, tasks: Sequence[Any], texts: Sequence[str], codes: Sequence[str | None],
              results: Sequence[EvalResult], prompts: Sequence[Any] | None = None,
              **per_line: Sequence[Any] | Any) -> None:
        """One line per completion. `per_line` values are either a sequence (one value per completion, e.g.
        `reward=[...]`) or a single value for all (e.g. `step=12`)."""
        lines = []
        with self._lock:
            for i, (task, text, code, result) in enumerate(zip(tasks, texts, codes, results, strict=True)):
                row: dict[str, Any] = {"stage": stage}
                for key, value in per_line.items():
                    row[key] = value[i] if isinstance(value, (list, tuple)) else value
                row.update(task_id=task.id, status=result.status.value, speedup=result.speedup,
                           message=result.message, code_found=code is not None, completion=text)
                if prompts is not None:
                    prompt = prompts[i]
                    digest = hashlib.sha256(json.dumps(prompt, sort_keys=True).encode()).hexdigest()
                    row["prompt_sha256"] = digest
                    if digest not in self._seen:
                        self._seen.add(digest)
                        row["prompt"] = prompt
                lines.append(json.dumps(row, default=str))
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write("".join(line + "\n" for line in lines))
