"""Report rows from the results store: one `ResultRow` per task per label, with baselines and speed of light.

Used by `cudal1 report` and by the audit. For each stored result the row gets:
- the level of its task (stored task row);
- published scores: the candidate's stored meta (`published`), else the release's `published/<release>`
  meta entry that audits write;
- its speedup vs every cached baseline of the same machine and protocol (`attach_baselines`, recomputed
  so baselines measured after the evaluation count too);
- speed-of-light fractions of the reference, the candidate and each successful baseline, when the GPU's
  peaks are in the store (`cudal1 baseline --peaks` measures them); fractions above 1 (peaks slightly
  under-measured) are clamped to 1.

Several candidates of one task under one label (an optimize run) collapse to the best correct one (else
the newest), because the metrics assume one row per task per label.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from cudal1.baselines.runner import LABEL_PREFIX, BaselineRecord, attach_baselines, load_baselines
from cudal1.baselines.sol import cached_task_cost, sol_fraction, stored_peaks
from cudal1.core.types import EvalResult, Status
from cudal1.metrics.rows import ResultRow, unusable
from cudal1.tasks.task import Task

logger = logging.getLogger(__name__)

PUBLISHED_META_PREFIX = "published/"


def _clamp(value: float | None) -> float | None:
    return None if value is None else min(max(value, 0.0), 1.0)


def sol_fractions(result: EvalResult, task: Task, store: Any,
                  records: dict[str, BaselineRecord] | None = None) -> dict[str, float]:
    """SOL fractions of reference, candidate and cached baselines (`records`, when already loaded for the
    result's machine and protocol); {} when peaks or cost are unknown."""
    peaks = stored_peaks(store, result.environment.get("gpu_name"))
    if peaks is None or result.timing is None:
        return {}
    cost = cached_task_cost(task, str(result.protocol.get("sizes", "full")), store)
    if cost.min_bytes is None and cost.flops is None:
        return {}
    times = {"reference": result.timing.ref_ms, "candidate": result.timing.candidate_ms}
    if records is None:
        records = load_baselines(store, task.hash, result.environment, result.protocol)
    for name, record in records.items():
        if record.ok:
            times[name] = record.ms
    out = {}
    for name, ms in times.items():
        frac = _clamp(sol_fraction(ms, cost.flops, cost.min_bytes, peaks, cost.dtype))
        if frac is not None:
            out[name] = frac
    return out


def row_from_result(result: EvalResult, task: Task, *, label: str, published: dict[str, Any] | None = None,
                    store: Any = None, with_sol: bool = True) -> ResultRow:
    """One report row for `result` of `task` (baselines attached and SOL computed when `store` is given)."""
    sol: dict[str, float] = {}
    measured = None
    if store is not None:
        records = load_baselines(store, task.hash, result.environment, result.protocol)  # read once
        if result.environment:  # the machine the baselines must come from is known
            measured = tuple(sorted(name for name, rec in records.items() if rec.ok))
        result = attach_baselines(result, task, store, records)
        if with_sol and result.status is Status.CORRECT:
            sol = sol_fractions(result, task, store, records)
    scores = {k: float(v) for k, v in (published or {}).items() if v is not None}
    return ResultRow.from_eval_dict(result.to_dict(), level=task.level, published=scores, label=label,
                                    sol=sol, measured_baselines=measured)


def _better(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether stored evaluation `a` should represent its task rather than `b` (best correct, else newest)."""
    a_ok, b_ok = a["status"] == Status.CORRECT.value, b["status"] == Status.CORRECT.value
    if a_ok != b_ok:
        return a_ok
    if a_ok and (a["speedup"] or 0.0) != (b["speedup"] or 0.0):
        return (a["speedup"] or 0.0) > (b["speedup"] or 0.0)
    return a["id"] > b["id"]


def stored_labels(store: Any, *, include_baselines: bool = False) -> list[str]:
    """Every label of the store's evaluations, sorted (baseline labels left out unless asked)."""
    labels = {r["label"] for r in store.query_evaluations()}
    return sorted(lb for lb in labels if include_baselines or not lb.startswith(LABEL_PREFIX))


def published_for(store: Any, candidate_hash: str, label: str) -> dict[str, Any]:
    """Published scores of a stored candidate: its meta, else the audit's release entry for `label`."""
    candidate = store.get_candidate(candidate_hash) or {}
    scores = (candidate.get("meta") or {}).get("published")
    if scores:
        return scores
    parts = label.split(":")
    if len(parts) >= 2 and parts[0] == "audit":
        table = store.get_meta(PUBLISHED_META_PREFIX + parts[1]) or {}
        return table.get(candidate_hash) or {}
    return {}


def rows_from_store(store: Any, labels: Sequence[str] | None = None, *, with_sol: bool = True,
                    skipped: list[tuple[dict[str, Any], str]] | None = None) -> list[ResultRow]:
    """One row per (label, task) from the store; `labels` None means every non-baseline label. A stored
    evaluation that cannot be a row (`metrics.rows.unusable`: a correct verdict with a NaN speedup, written by an
    older version) is left out, with why, in `skipped` when given: one bad row never breaks a report."""
    rows: list[ResultRow] = []
    for label in labels if labels is not None else stored_labels(store):
        best: dict[str, dict[str, Any]] = {}
        for rec in store.query_evaluations(label=label, latest_per_task_candidate=True):
            reason = unusable(rec["result"])
            if reason is not None:  # the caller that collects them says so; otherwise the log does
                (logger.info if skipped is not None else logger.warning)("%s (%s): skipped, %s", rec["task_id"],
                                                                         label, reason)
                if skipped is not None:
                    skipped.append((rec, reason))
                continue
            current = best.get(rec["task_id"])
            if current is None or _better(rec, current):
                best[rec["task_id"]] = rec
        for task_id, rec in sorted(best.items()):
            stored_task = store.get_task(task_id, source_hash=rec["task_hash"])
            if stored_task is None:
                logger.warning("no stored task %s (%s); skipped", task_id, rec["task_hash"][:12])
                continue
            task = Task(id=task_id, source=stored_task["source"], level=stored_task["level"],
                        origin=stored_task.get("origin", ""))
            result = EvalResult.from_dict(rec["result"])
            rows.append(row_from_result(result, task, label=label, store=store, with_sol=with_sol,
                                        published=published_for(store, rec["candidate_hash"], label)))
    return rows
