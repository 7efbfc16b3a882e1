"""A stand-in for `experimental.contrastive_study.bench.run_worker` (no GPU): it measures a task by writing made-up cells, and
dies like a CUDA context killed by a kernel the first time it reaches a chosen cell."""

from __future__ import annotations

import json
import os
from pathlib import Path

from experimental.contrastive_study.bench import task_entry
from experimental.contrastive_study.ops import task_by_id
from experimental.contrastive_study.recipes import SPACE
from experimental.contrastive_study.table import load_table, write_table

CRASH_AT = ("study/gelu_n26", "T128 V2 I2 O S0 M1")


def fake_worker(table_path: str, task_ids: list[str], reps: int, deadline: float, progress: str,
                skip: dict[str, dict[str, str]]) -> None:
    data = load_table(Path(table_path))
    for task_id in task_ids:
        cells = {}
        for recipe in SPACE:
            if (task_id, recipe.text) == CRASH_AT and recipe.text not in skip.get(task_id, {}):
                Path(progress).write_text(json.dumps({"task": task_id, "recipe": recipe.text}))
                os._exit(3)  # what a kernel that kills the context does to the process
            cells[recipe.text] = skip.get(task_id, {}).get(recipe.text) and {"status": "runtime_error"} or {
                "status": "correct", "times_ms": [1.0] * reps, "median_ms": 1.0, "speedup": 1.0}
        data["tasks"][task_id] = {**task_entry(task_by_id()[task_id]), "cells": cells,
                                  "ref": {"times_ms": [1.0] * 2 * reps}}
        write_table(Path(table_path), data)
