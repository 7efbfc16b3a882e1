"""`spotcheck`: does the micro-benchmark's table agree with the project's trusted evaluator?

A stratified sample of the table's cells (`choose_cells`: on the smallest size of every family, the best,
the worst and evenly spaced ranks of the correct cells, plus cells the table marks failed) is evaluated
again as raw-CUDA `ModelNew` candidates (`kernels.candidate_source`) through `cudal1.service.evaluator`
(sandboxed runners, paired timing against the PyTorch reference, correctness on fresh inputs). Written to
`spotcheck.json` as results arrive (a second run evaluates only the cells still missing): each cell's status
and speedup in the table and from the evaluator, and the agreement: statuses that match, Spearman's rank
correlation of the speedups of cells correct in both, the median |log(evaluator / table)|, the share within
x1.25, and the median ratio per kind.

The two clocks differ on purpose: the table times one kernel launch with events; the evaluator times the
whole `forward` call (its allocation and Python launch too) against the reference's, so ratios below 1 on
the fastest cells are expected; the ranks are what the study relies on.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any

from cudal1.core.types import EvalResult, Status
from experimental.contrastive_study.kernels import candidate_source
from experimental.contrastive_study.ops import task_by_id
from experimental.contrastive_study.provenance import provenance
from experimental.contrastive_study.recipes import BY_TEXT
from experimental.contrastive_study.stats import spearman
from experimental.contrastive_study.table import Table

logger = logging.getLogger(__name__)


def choose_cells(table: Table, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """About `n` (task id, recipe) cells: per family its smallest task, ranks spread over the correct cells
    and one failed cell where there is one; round-robin over families until `n`."""
    by_family: dict[str, str] = {}
    for tid, entry in table.tasks.items():
        current = by_family.get(entry["family"])
        if current is None or entry["rows"] * entry["cols"] < table.tasks[current]["rows"] * table.tasks[current]["cols"]:
            by_family[entry["family"]] = tid
    queues = []
    for tid in sorted(by_family.values()):
        ranked = sorted(table.correct_recipes(tid), key=lambda r: table.speedup(tid, r))
        k = max(2, n // max(1, len(by_family)))
        picks = [ranked[round(i * (len(ranked) - 1) / (k - 1))] for i in range(k)] if len(ranked) >= k else ranked
        failed = [r for r, c in table.tasks[tid]["cells"].items() if c["status"] != "correct"]
        queue = list(dict.fromkeys(picks[::-1]))  # best first
        if failed:
            queue.insert(1, failed[seed % len(failed)])
        queues.append([(tid, r) for r in queue])
    chosen: list[tuple[str, str]] = []
    while len(chosen) < n and any(queues):
        for queue in queues:
            if queue and len(chosen) < n:
                chosen.append(queue.pop(0))
    return chosen


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How the evaluator's verdicts agree with the table's (module docstring)."""
    done = [r for r in rows if r.get("evaluator_status")]
    both = [r for r in done if r["table_speedup"] and r["evaluator_speedup"]]
    ratios = [r["evaluator_speedup"] / r["table_speedup"] for r in both]
    by_kind: dict[str, list[float]] = {}
    for r, ratio in zip(both, ratios, strict=True):
        by_kind.setdefault(r["kind"], []).append(ratio)
    same = sum((r["table_status"] == "correct") == (r["evaluator_status"] == "correct") for r in done)
    return {"cells": len(rows), "evaluated": len(done), "status_agreement": round(same / len(done), 4) if done else None,
            "correct_in_both": len(both),
            "spearman": round(spearman([r["table_speedup"] for r in both], [r["evaluator_speedup"] for r in both]), 4)
            if len(both) > 2 else None,
            "median_abs_log_ratio": round(statistics.median(abs(math.log(x)) for x in ratios), 4) if ratios else None,
            "within_1_25x": round(sum(0.8 <= x <= 1.25 for x in ratios) / len(ratios), 4) if ratios else None,
            "median_ratio_by_kind": {k: round(statistics.median(v), 4) for k, v in sorted(by_kind.items())}}


def spotcheck(table_path: Path, out_dir: Path, *, n: int = 60, budget_s: float = 240.0, profile: str = "cuda-l1",
              device: str = "cuda", seed: int = 0) -> dict[str, Any]:
    """Evaluate `n` cells of the table through the project's evaluator; writes `out_dir/spotcheck.json`."""
    from cudal1.eval.config import EvalConfig
    from cudal1.service.evaluator import make_evaluator

    table = Table.load(table_path)
    tasks = task_by_id()
    out = out_dir / "spotcheck.json"
    earlier = json.loads(out.read_text()) if out.is_file() else {}
    done = {(r["task"], r["recipe"]): r for r in earlier.get("rows", []) if r.get("evaluator_status")}
    rows: list[dict[str, Any]] = []
    for tid, recipe in choose_cells(table, n, seed):
        cell = table.cell(tid, recipe) or {}
        rows.append(done.get((tid, recipe)) or {
            "task": tid, "recipe": recipe, "kind": table.tasks[tid]["kind"], "table_status": cell.get("status"),
            "table_speedup": cell.get("speedup") if cell.get("status") == "correct" else None})
    todo = [i for i, r in enumerate(rows) if not r.get("evaluator_status")]  # a second run evaluates the rest
    pairs = [(tasks[rows[i]["task"]].to_task(), candidate_source(tasks[rows[i]["task"]], BY_TEXT[rows[i]["recipe"]]))
             for i in todo]
    started = time.monotonic()
    spent = float(earlier.get("seconds", 0.0))
    runs = [*earlier.get("runs", []), provenance(cells_to_evaluate=len(todo))]  # each run's code, host and date

    def write() -> dict[str, Any]:
        summary = {"profile": profile, "table": str(table_path), "table_kind": table.kind,
                   "seconds": round(spent + time.monotonic() - started, 1), **agreement(rows), "runs": runs,
                   "rows": rows}
        out.write_text(json.dumps(summary, indent=1))
        return summary

    def on_result(j: int, result: EvalResult) -> None:
        row = rows[todo[j]]
        row.update(evaluator_status=result.status.value, message=result.message[:160],
                   evaluator_speedup=result.speedup if result.status is Status.CORRECT else None)
        logger.info("%s %s: table %s %s, evaluator %s %s", row["task"], row["recipe"], row["table_status"],
                    row["table_speedup"], result.status.value, result.speedup)
        write()

    out_dir.mkdir(parents=True, exist_ok=True)
    if pairs:
        evaluator = make_evaluator("", EvalConfig(profile=profile, device=device))
        try:
            evaluator.evaluate(pairs, on_result=on_result, force=True,
                               should_stop=lambda: time.monotonic() - started > budget_s)
        finally:
            evaluator.close()
    return write()
