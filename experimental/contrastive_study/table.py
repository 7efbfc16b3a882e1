"""The task table: every (task, recipe) cell's status, timings and speedup, as JSON, and how it is read.

Format (`table.json`):

    {"format": 1, "kind": "measured" | "surrogate", "provenance": {...}, "space": [recipe texts],
     "compile_errors": {"family|recipe": message},
     "tasks": {task id: {"family", "kind", "rows", "cols", "held_out", "features", "min_bytes",
                         "ref": {"times_ms", "median_ms", "spread"},
                         "cells": {recipe: {"status", "times_ms", "median_ms", "spread", "speedup"} or
                                           {"status", "message"}}}}}

`kind` says where the numbers come from: `measured` (bench.py on a GPU) or `surrogate` (surrogate.py's
analytic model, for building and testing the pipeline on a CPU: never a result). A table whose held-out
tasks were relabelled (`perturb.py`) says so under `perturbation`. `Table` reads it as the study's
evaluator: a cell's result as the results store would return it (`result`), its raw reward (`speedup`: the
speedup of a correct cell, 0 otherwise; the median of its timings over the reference's), and one new
evaluation of it with the measured noise drawn (`draw`, `noisy_result`).

The noise of an evaluation (`noise`): a cell's speedup is the median of the reference's timings over the
median of the cell's, each a median of n timings whose relative standard deviation the table measured; the
standard error of a median of n is about sqrt(pi / 2) s / sqrt(n), so one evaluation's log speedup is drawn
from a normal around the table's with sigma = sqrt(pi / 2) x sqrt(s_cell^2 / n_cell + s_ref^2 / n_ref)
(times `noise_scale`), and its 95 % interval is the draw x exp(+-1.96 sigma), as the evaluator reports one
(`EvalResult.timing.speedup_ci`: `reward_speedup: lower` pays its low end). On the H100 table the median
cell's sigma is about 0.2 % (its 90th percentile 0.5 %): far below the 2.5 % median difference between two
evaluations of one kernel through the evaluator (log, 2026-12-05), which `noise_scale` can stand for.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
from pathlib import Path
from typing import Any

from cudal1.core.types import EvalResult, Status, TimingStats
from cudal1.tasks.task import Task
from experimental.contrastive_study.recipes import SPACE

TABLE_FORMAT = 1
KINDS = ("measured", "surrogate")


def new_table(kind: str, provenance: dict[str, Any]) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"table kind must be one of {KINDS}, not {kind!r}")
    return {"format": TABLE_FORMAT, "kind": kind, "provenance": provenance, "space": [r.text for r in SPACE],
            "compile_errors": {}, "tasks": {}}


def load_table(path: Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if data.get("format") != TABLE_FORMAT:
        raise ValueError(f"{path}: not a study table of format {TABLE_FORMAT}")
    return data


def write_table(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (a reader never sees half a table)."""
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")))
    os.replace(tmp, path)


class Table:
    """A table read as the study's evaluator (see the module docstring)."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.kind = data["kind"]
        self.tasks: dict[str, dict[str, Any]] = data["tasks"]
        self._best = {tid: max((self.speedup(tid, r) for r in entry["cells"]), default=0.0)
                      for tid, entry in self.tasks.items()}
        gpu = data.get("provenance", {}).get("environment", {}).get("gpu", self.kind)
        #: What every verdict of the table says measured it (an exemplar's score context: `score_context`).
        self.environment = {"gpu_name": gpu}
        self.protocol = {"profile": "study-table", "version": f"table-{self.kind}", "sizes": "full"}

    @classmethod
    def load(cls, path: Path) -> Table:
        return cls(load_table(path))

    def cell(self, task_id: str, recipe: str | None) -> dict[str, Any] | None:
        return self.tasks[task_id]["cells"].get(recipe or "")

    def speedup(self, task_id: str, recipe: str | None) -> float:
        """The raw reward of a recipe: its speedup when correct, else 0."""
        cell = self.cell(task_id, recipe)
        return float(cell["speedup"]) if cell and cell["status"] == "correct" else 0.0

    def result(self, task: Task, recipe: str) -> EvalResult:
        """The cell's verdict as the evaluator gave it (recipe text in, as `KernelReward` extracts it)."""
        cell = self.cell(task.id, recipe)
        if cell is None:
            return EvalResult(Status.INFRA_ERROR, "not in the table", task_id=task.id)
        return EvalResult(Status(cell["status"]), cell.get("message", ""), task_id=task.id,
                          speedup=cell.get("speedup"), environment=dict(self.environment),
                          protocol=dict(self.protocol))

    @property
    def context(self) -> str:
        """The score context of the table's verdicts (`exemplars.db.score_context`)."""
        from cudal1.exemplars.db import score_context

        return score_context({"environment": self.environment, "protocol": self.protocol})

    def noise(self, task_id: str, recipe: str | None, scale: float = 1.0) -> float:
        """sigma of one evaluation's log speedup (module docstring); 0 for a failure."""
        cell = self.cell(task_id, recipe)
        if not cell or cell["status"] != "correct":
            return 0.0
        ref = self.tasks[task_id]["ref"]["times_ms"]
        times = cell.get("times_ms") or [cell["median_ms"]]

        def rel_var(xs: list[float]) -> float:
            return (statistics.stdev(xs) / statistics.median(xs)) ** 2 / len(xs) if len(xs) > 1 else 0.0

        return scale * math.sqrt(math.pi / 2 * (rel_var(times) + rel_var(ref)))

    def draw(self, task_id: str, recipe: str | None, rng: random.Random,
             scale: float = 1.0) -> tuple[float, list[float] | None]:
        """One evaluation of a cell with its measured noise: (speedup, its 95 % interval); (0, None) when the
        cell is not correct."""
        speedup = self.speedup(task_id, recipe)
        if speedup <= 0:
            return 0.0, None
        sigma = self.noise(task_id, recipe, scale)
        drawn = speedup * math.exp(rng.gauss(0.0, sigma))
        return drawn, [drawn * math.exp(-1.96 * sigma), drawn * math.exp(1.96 * sigma)]

    def noisy_result(self, task: Task, recipe: str, rng: random.Random, scale: float = 1.0) -> EvalResult:
        """`result` with the speedup of one noisy evaluation and its interval (`draw`)."""
        result = self.result(task, recipe)
        if result.status is not Status.CORRECT:
            return result
        speedup, ci = self.draw(task.id, recipe, rng, scale)
        ref_ms = float(self.tasks[task.id]["ref"]["median_ms"])
        timing = TimingStats(ref_ms=ref_ms, candidate_ms=ref_ms / speedup, speedup=speedup,
                             stability=self.noise(task.id, recipe, scale), bucket_speedups=[],
                             method="study_table_draw", speedup_ci=ci)
        return result.replace(speedup=speedup, timing=timing)

    def best(self, task_id: str) -> float:
        return self._best[task_id]

    def best_recipe(self, task_id: str) -> str:
        return max(self.tasks[task_id]["cells"], key=lambda r: self.speedup(task_id, r))

    def correct_recipes(self, task_id: str) -> list[str]:
        return [r for r, c in self.tasks[task_id]["cells"].items() if c["status"] == "correct"]

    def split(self) -> tuple[list[str], list[str]]:
        """(training task ids, held-out task ids), each in table order."""
        train = [tid for tid, e in self.tasks.items() if not e["held_out"]]
        return train, [tid for tid, e in self.tasks.items() if e["held_out"]]

    def landscape(self, task_id: str) -> dict[str, Any]:
        """A task's landscape in a few numbers (for reports)."""
        values = [self.speedup(task_id, r) for r in self.tasks[task_id]["cells"]]
        correct = [v for v in values if v > 0]
        return {"best": round(max(values), 4), "best_recipe": self.best_recipe(task_id),
                "median_correct": round(statistics.median(correct), 4) if correct else None,
                "correct": len(correct), "recipes": len(values),
                "within_5pct_of_best": sum(v >= 0.95 * max(values) for v in values)}

    def problems(self, min_reps: int = 5) -> list[str]:
        """What keeps the table from being used for the study: missing cells, too few timings."""
        out = []
        for tid, entry in self.tasks.items():
            missing = [r.text for r in SPACE if r.text not in entry.get("cells", {})]
            if missing:
                out.append(f"{tid}: {len(missing)} recipes not measured")
            short = [r for r, c in entry.get("cells", {}).items()
                     if c["status"] == "correct" and len(c.get("times_ms", [])) < min_reps]
            if short:
                out.append(f"{tid}: {len(short)} correct cells with fewer than {min_reps} timings")
            if len(entry.get("ref", {}).get("times_ms", [])) < min_reps:
                out.append(f"{tid}: the reference has fewer than {min_reps} timings")
        return out
