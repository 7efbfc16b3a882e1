"""Does a new audit reproduce an earlier one? Two `audit.json` reports compared task by task.

    from cudal1.audit.compare import compare_audits, load_audit
    comparison = compare_audits(load_audit("docs/audit/x/audit.json"), load_audit("rerun/audit.json"))
    print(comparison.reproduced, comparison.lines())

Only tasks present in both reports are compared, so a small re-run (a few tasks per level) checks a full
audit. Compared: the verdict of every shared task; the candidate's speedup vs eager where both verdicts
are correct; and each stored baseline (status, and its measured speedup vs eager: for eager itself, the
null test's ratio). Speedups are compared as new / earlier ratios, never as absolute times, since two runs
can meet the GPU in different clock and thermal states.

The new run *reproduces* the earlier one when every shared verdict agrees, every baseline has the same
status (measured or failed) in both, and the median ratio of each compared series lies within
`tolerance` of 1 (in either direction). Single tasks outside that band are listed but do not fail the
comparison: one candidate's speedup can move by 15-20 % between runs (see the precision benchmark), while
a systematic shift moves the median.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cudal1.errors import SourceError

#: Default band around 1 for median ratios (and for listing single tasks), from the precision benchmark's
#: worst cases between two runs.
DEFAULT_TOLERANCE = 0.10


def load_audit(path: str | Path) -> dict[str, Any]:
    """An audit report's `audit.json` (a report folder names its `audit.json`); `SourceError` when it is
    missing or not an audit report."""
    where = Path(path)
    if where.is_dir():
        where = where / "audit.json"
    if not where.is_file():
        raise SourceError(f"no audit report at {where}: give an audit.json or the report folder holding it")
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"{where} is not an audit report (not JSON: {exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list):
        raise SourceError(f"{where} is not an audit report (no 'tasks' list)")
    return data


@dataclass(frozen=True)
class RatioSeries:
    """New / earlier speedup ratios of one compared quantity, over the tasks measured in both reports."""

    name: str
    ratios: dict[str, float]  # task id -> new / earlier

    def median(self) -> float | None:
        return statistics.median(self.ratios.values()) if self.ratios else None

    def quantile(self, q: float) -> float | None:
        """Linear-interpolated quantile (numpy's default, as the report's percentiles)."""
        return float(np.quantile(list(self.ratios.values()), q)) if self.ratios else None

    def outside(self, tolerance: float) -> dict[str, float]:
        """Tasks whose ratio lies outside [1/(1+tolerance), 1+tolerance]."""
        return {t: r for t, r in self.ratios.items() if not _within(r, tolerance)}

    def within(self, tolerance: float) -> bool:
        median = self.median()
        return median is None or _within(median, tolerance)


@dataclass
class AuditComparison:
    """What two audits say about their shared tasks (see the module docstring for the rule)."""

    tolerance: float
    machines: tuple[str, str]
    shared: list[str]
    only_earlier: int
    only_new: int
    verdicts_agree: int
    verdict_changes: dict[str, tuple[str, str]]  # task -> (earlier, new)
    series: list[RatioSeries] = field(default_factory=list)
    baseline_status_changes: dict[str, tuple[str, str]] = field(default_factory=dict)  # "task kind" -> (a, b)
    survival: tuple[int, int, int] = (0, 0, 0)  # (published, survive earlier, survive new) vs eager

    @property
    def reproduced(self) -> bool:
        return (bool(self.shared) and not self.verdict_changes and not self.baseline_status_changes
                and all(s.within(self.tolerance) for s in self.series))

    def to_dict(self) -> dict[str, Any]:
        return {
            "reproduced": self.reproduced, "tolerance": self.tolerance,
            "machines": {"earlier": self.machines[0], "new": self.machines[1]},
            "shared_tasks": len(self.shared), "only_earlier": self.only_earlier, "only_new": self.only_new,
            "verdicts_agree": self.verdicts_agree,
            "verdict_changes": {t: {"earlier": a, "new": b} for t, (a, b) in self.verdict_changes.items()},
            "baseline_status_changes": {k: {"earlier": a, "new": b}
                                        for k, (a, b) in self.baseline_status_changes.items()},
            "series": {s.name: {"tasks": len(s.ratios), "median": s.median(), "p10": s.quantile(0.1),
                                "p90": s.quantile(0.9), "outside": s.outside(self.tolerance), "ratios": s.ratios}
                       for s in self.series},
            "survival_vs_eager": dict(zip(("published", "survive_earlier", "survive_new"), self.survival, strict=True)),
        }

    def lines(self) -> list[str]:
        """The comparison as plain lines, verdict first."""
        band = f"±{self.tolerance:.0%}"
        head = "REPRODUCED" if self.reproduced else "NOT REPRODUCED"
        out = [f"{head}: {len(self.shared)} shared tasks; verdicts agree on {self.verdicts_agree}; "
               f"medians within {band}" + ("" if self.reproduced or self.shared else " (no shared tasks)")]
        if self.machines[0] != self.machines[1]:
            out.append(f"note: different machines ({self.machines[0]} vs {self.machines[1]}): "
                       "a comparison, not a reproduction")
        for task, (a, b) in sorted(self.verdict_changes.items()):
            out.append(f"verdict changed: {task}: {a} -> {b}")
        for key, (a, b) in sorted(self.baseline_status_changes.items()):
            out.append(f"baseline changed: {key}: {a} -> {b}")
        for s in self.series:
            if not s.ratios:
                continue
            outside = s.outside(self.tolerance)
            out.append(f"{s.name}: {len(s.ratios)} tasks, new/earlier median {s.median():.3f} "
                       f"(p10 {s.quantile(0.1):.3f}, p90 {s.quantile(0.9):.3f}); {len(outside)} outside {band}"
                       + ("" if s.within(self.tolerance) else "  <- median outside the band"))
            out += [f"  {task}: {ratio:.3f}" for task, ratio in sorted(outside.items())]
        published, before, after = self.survival
        out.append(f"published speedups vs eager that survive, shared tasks: {before}/{published} earlier, "
                   f"{after}/{published} new")
        if self.only_earlier or self.only_new:
            out.append(f"not compared: {self.only_earlier} tasks only in the earlier report, "
                       f"{self.only_new} only in the new one")
        return out


def _within(ratio: float, tolerance: float) -> bool:
    return 1 / (1 + tolerance) <= ratio <= 1 + tolerance


def _main_rows(report: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The report's own run (its `label`), by task id; other profiles' rows shown beside it are left out."""
    label = report.get("label")
    return {row["task_id"]: row for row in report["tasks"]
            if isinstance(row, dict) and "task_id" in row and (label is None or row.get("label") == label)}


def _ratio(new: Any, earlier: Any) -> float | None:
    if isinstance(new, (int, float)) and isinstance(earlier, (int, float)) and new > 0 and earlier > 0:
        return float(new) / float(earlier)
    return None


def _baseline_series(earlier: Mapping[str, Any], new: Mapping[str, Any], shared: Iterable[str]
                     ) -> tuple[list[RatioSeries], dict[str, tuple[str, str]]]:
    """Per baseline kind: measured speedup ratios where both measured it, and status changes."""
    a_all = (earlier.get("baseline_coverage") or {}).get("per_task") or {}
    b_all = (new.get("baseline_coverage") or {}).get("per_task") or {}
    ratios: dict[str, dict[str, float]] = {}
    changes: dict[str, tuple[str, str]] = {}
    for task in shared:
        a_kinds, b_kinds = a_all.get(task) or {}, b_all.get(task) or {}
        for kind in sorted(set(a_kinds) & set(b_kinds)):
            a, b = a_kinds[kind], b_kinds[kind]
            if a.get("status") != b.get("status"):
                changes[f"{task} {kind}"] = (str(a.get("status")), str(b.get("status")))
                continue
            ratio = _ratio(b.get("measured_speedup"), a.get("measured_speedup"))
            if ratio is not None:
                ratios.setdefault(kind, {})[task] = ratio
    names = {"eager": "baseline eager (null test)"}
    series = [RatioSeries(names.get(kind, f"baseline {kind} vs eager"), values)
              for kind, values in sorted(ratios.items())]
    return series, changes


def compare_audits(earlier: Mapping[str, Any], new: Mapping[str, Any],
                   tolerance: float = DEFAULT_TOLERANCE) -> AuditComparison:
    """Compare two audit reports (`load_audit`) on the tasks they share; see the module docstring."""
    if not tolerance > 0:
        raise SourceError(f"tolerance must be > 0, not {tolerance}")
    a_rows, b_rows = _main_rows(earlier), _main_rows(new)
    shared = sorted(set(a_rows) & set(b_rows))
    changes = {t: (a_rows[t]["status"], b_rows[t]["status"]) for t in shared
               if a_rows[t].get("status") != b_rows[t].get("status")}
    candidate = {t: r for t in shared
                 if (r := _ratio(b_rows[t].get("speedup"), a_rows[t].get("speedup"))) is not None
                 and t not in changes}
    series, baseline_changes = _baseline_series(earlier, new, shared)
    published = [t for t in shared if a_rows[t].get("survives") is not None]
    survival = (len(published), sum(bool(a_rows[t]["survives"]) for t in published),
                sum(bool(b_rows[t].get("survives")) for t in published))
    machines = tuple(str((r.get("meta") or {}).get("machine", "?")) for r in (earlier, new))
    return AuditComparison(
        tolerance=tolerance, machines=machines, shared=shared,  # type: ignore[arg-type]
        only_earlier=len(set(a_rows) - set(b_rows)), only_new=len(set(b_rows) - set(a_rows)),
        verdicts_agree=len(shared) - len(changes), verdict_changes=changes,
        series=[RatioSeries("candidate speedup vs eager", candidate), *series],
        baseline_status_changes=baseline_changes, survival=survival)
