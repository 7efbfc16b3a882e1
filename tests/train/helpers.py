"""Helpers of the training tests (importable as `tests.train.helpers`)."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURE_TASKS = Path(__file__).parent / "fixtures" / "tasks"


def correct_code(task) -> str:
    """A correct candidate: the reference with `Model` renamed to `ModelNew`."""
    return task.source.replace("class Model(", "class ModelNew(")


def wrong_code(task) -> str:
    """An incorrect candidate: the reference's output plus one."""
    code = correct_code(task)
    return code.replace("    def forward(self, x):\n        return ", "    def forward(self, x):\n        return 1.0 + ")


def common_overrides(tmp_path: Path, **extra) -> dict:
    """Settings every tiny CPU run shares."""
    values = {"model": "scratch", "output_dir": str(tmp_path / "run"), "source": str(FIXTURE_TASKS),
              "use_cpu": True, "report_to": "none", "store": "none", "eval_device": "cpu",
              "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "max_steps": 2,
              "logging_steps": 1, "warmup_ratio": 0.0, "lr_scheduler_type": "constant", "eval_threads": 2,
              "split": "all"}
    values.update(extra)
    return values


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
