"""Does a new audit reproduce an earlier one? Two `audit.json` reports compared task by task.

    from cudal1.audit.compare import compare_audits, load_audit
    comparison = compare_audits(load_audit("docs/audit/x/audit.json"), load_audit("rerun/audit.json"))
    print(comparison.reproduced, comparison.lines())

Only tasks present in both reports are compared, so a small re-run (a few tasks per level) checks a full
audit. Compared: the verdict of every shared task; the candidate's speedup vs eager where both verdicts
are correct; and each stored baseline (status, and its measured speedup vs eager: for eager itself, the
null test's ratio). Speedups are compared as new / earlier ratios, never as absolute times, since two runs
can meet the GPU in different clock and thermal states.

The new run *reproduces* the earlier one when both ran under the same correctness profile and protocol
version, every shared verdict agrees, every baseline has the same
status (measured or failed) in both, nothing measured on one side lacks its speedup on the other, and the
median ratio of each compared series lies in the band [1/(1+tolerance), 1+tolerance] (symmetric on a log
scale: x1.1 either way for 0.1). Single tasks outside the band are listed but do not fail the comparison:
one candidate's speedup moved by up to 21.5 % between two evaluations in the same run (the precision
benchmark, docs/log.md), while a systematic shift moves the median.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cudal1.core.errors import SourceError

#: Default band around 1 for median ratios (and for listing single tasks). A choice, not a derived bound:
#: in a re-audit of 12 tasks from fresh stores, hours later, every series' median ratio fell within
#: 0.99-1.02 (docs/log.md).
DEFAULT_TOLERANCE = 0.10


#: Settings that must be equal for a reproduction (verdicts and speedups mean something else otherwise);
#: a different machine is noted, since checking a report on one's own GPU is the point.
MUST_MATCH = ("profiles", "protocol versions")


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
    """New / earlier speedup ratios of one compared quantity, over the tasks measured in both reports.

    Its median and quantiles are taken over log-ratios (a geometric median), so swapping the two reports
    turns each figure into its reciprocal and never changes whether it lies in the band."""

    name: str
    ratios: dict[str, float]  # task id -> new / earlier

    def quantile(self, q: float) -> float | None:
        """Quantile of the ratios on a log scale (linear interpolation between log-ratios)."""
        if not self.ratios:
            return None
        return float(np.exp(np.quantile(np.log(list(self.ratios.values())), q)))

    def median(self) -> float | None:
        return self.quantile(0.5)

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
    settings: dict[str, tuple[str, str]]  # machine, profile, protocol version -> (earlier, new)
    shared: list[str]
    only_earlier: int
    only_new: int
    verdicts_agree: int
    verdict_changes: dict[str, tuple[str, str]]  # task -> (earlier, new)
    series: list[RatioSeries] = field(default_factory=list)
    baseline_status_changes: dict[str, tuple[str, str]] = field(default_factory=dict)  # "task kind" -> (a, b)
    missing: dict[str, str] = field(default_factory=dict)  # "task [kind]" -> what one side lacks
    baseline_kinds: tuple[int, int] = (0, 0)  # kinds with stored baselines on shared tasks (earlier, new)
    survival: tuple[int, int, int] = (0, 0, 0)  # (published, survive earlier, survive new) vs eager

    @property
    def reproduced(self) -> bool:
        return (bool(self.shared) and not self.verdict_changes and not self.baseline_status_changes
                and not self.missing and all(s.within(self.tolerance) for s in self.series)
                and not any(self.settings[name][0] != self.settings[name][1] for name in MUST_MATCH))

    def band(self) -> str:
        return f"x{1 + self.tolerance:.3g} ({1 / (1 + self.tolerance):.3f}-{1 + self.tolerance:.3f})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "reproduced": self.reproduced, "tolerance": self.tolerance,
            "band": [1 / (1 + self.tolerance), 1 + self.tolerance],
            "settings": {name: {"earlier": a, "new": b} for name, (a, b) in self.settings.items()},
            "shared_tasks": len(self.shared), "only_earlier": self.only_earlier, "only_new": self.only_new,
            "verdicts_agree": self.verdicts_agree,
            "verdict_changes": {t: {"earlier": a, "new": b} for t, (a, b) in self.verdict_changes.items()},
            "baseline_status_changes": {k: {"earlier": a, "new": b}
                                        for k, (a, b) in self.baseline_status_changes.items()},
            "missing": dict(self.missing),
            "series": {s.name: {"tasks": len(s.ratios), "median": s.median(), "p10": s.quantile(0.1),
                                "p90": s.quantile(0.9), "outside": s.outside(self.tolerance), "ratios": s.ratios}
                       for s in self.series},
            "survival_vs_eager": dict(zip(("published", "survive_earlier", "survive_new"), self.survival,
                                          strict=True)),
        }

    def lines(self) -> list[str]:
        """The comparison as plain lines, verdict first."""
        band = self.band()
        if self.reproduced:
            head = (f"REPRODUCED: {len(self.shared)} shared tasks; every verdict and baseline status agrees; "
                    f"every median ratio within {band}")
        else:
            head = (f"NOT REPRODUCED: {len(self.shared)} shared tasks; verdicts agree on {self.verdicts_agree}"
                    + ("" if self.shared else " (no shared tasks)")
                    + " (the rule: same profile and protocol version, same verdicts and baseline statuses, no "
                    f"speedup missing, every median ratio within {band})")
        out = [head]
        for name, (a, b) in self.settings.items():
            if a != b:
                out.append(f"different {name} ({a} vs {b}): verdicts or speedups mean something else"
                           if name in MUST_MATCH else
                           f"note: different {name} ({a} vs {b}): speedups compared across machines")
        out += [f"verdict changed: {task}: {a} -> {b}" for task, (a, b) in sorted(self.verdict_changes.items())]
        out += [f"baseline changed: {key}: {a} -> {b}" for key, (a, b) in sorted(self.baseline_status_changes.items())]
        out += [f"missing: {key}: {what}" for key, what in sorted(self.missing.items())]
        for s in self.series:
            if not s.ratios:
                out.append(f"{s.name}: 0 tasks measured in both")
                continue
            outside = s.outside(self.tolerance)
            out.append(f"{s.name}: {len(s.ratios)} tasks, new/earlier median {s.median():.3f} "
                       f"(p10 {s.quantile(0.1):.3f}, p90 {s.quantile(0.9):.3f}); {len(outside)} outside {band}"
                       + ("" if s.within(self.tolerance) else "  <- median outside the band"))
            out += [f"  {task}: {ratio:.3f}" for task, ratio in sorted(outside.items())]
        if not any(s.name.startswith("baseline") for s in self.series):
            out.append(f"baselines: none compared (stored kinds on the shared tasks: {self.baseline_kinds[0]} "
                       f"earlier, {self.baseline_kinds[1]} new)")
        published, before, after = self.survival
        out.append(f"published speedups vs eager that survive, shared tasks: {before}/{published} earlier, "
                   f"{after}/{published} new")
        if self.only_earlier or self.only_new:
            out.append(f"not compared: {self.only_earlier} tasks only in the earlier report, "
                       f"{self.only_new} only in the new one")
        return out


def _within(ratio: float, tolerance: float) -> bool:
    return 1 / (1 + tolerance) <= ratio <= 1 + tolerance


def _main_rows(report: Mapping[str, Any], which: str) -> dict[str, dict[str, Any]]:
    """The report's own run, by task id: rows of its `label` (the first row's label when it names none);
    other profiles' rows shown beside it are left out. `SourceError` when no row is left."""
    rows = [r for r in report["tasks"] if isinstance(r, dict) and isinstance(r.get("task_id"), str)]
    label = report.get("label") or (rows[0].get("label") if rows else None)
    mine = {r["task_id"]: r for r in rows if label is None or r.get("label") == label}
    if report["tasks"] and not mine:
        raise SourceError(f"the {which} report has no task rows of its run {label!r}")
    return mine


def _ratio(new: Any, earlier: Any) -> float | None:
    if isinstance(new, (int, float)) and isinstance(earlier, (int, float)) and new > 0 and earlier > 0:
        return float(new) / float(earlier)
    return None


def _per_task(report: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """`baseline_coverage.per_task` with anything that is not a mapping left out."""
    coverage = report.get("baseline_coverage")
    per_task = coverage.get("per_task") if isinstance(coverage, dict) else None
    if not isinstance(per_task, dict):
        return {}
    return {task: {k: v for k, v in kinds.items() if isinstance(v, dict)}
            for task, kinds in per_task.items() if isinstance(kinds, dict)}


def _baseline_series(earlier: Mapping[str, Any], new: Mapping[str, Any], shared: Iterable[str]
                     ) -> tuple[list[RatioSeries], dict[str, tuple[str, str]], dict[str, str], tuple[int, int]]:
    """Per baseline kind: measured speedup ratios where both measured it; status changes; baselines measured
    on both sides but without a speedup on one; and how many kinds each side stores for the shared tasks."""
    a_all, b_all = _per_task(earlier), _per_task(new)
    ratios: dict[str, dict[str, float]] = {}
    changes: dict[str, tuple[str, str]] = {}
    missing: dict[str, str] = {}
    kinds: tuple[set[str], set[str]] = (set(), set())
    for task in shared:
        a_kinds, b_kinds = a_all.get(task, {}), b_all.get(task, {})
        kinds[0].update(a_kinds)
        kinds[1].update(b_kinds)
        for kind in sorted(set(a_kinds) & set(b_kinds)):
            a, b = a_kinds[kind], b_kinds[kind]
            if a.get("status") != b.get("status"):
                changes[f"{task} {kind}"] = (str(a.get("status")), str(b.get("status")))
                continue
            if a.get("status") != "ok":
                continue
            ratio = _ratio(b.get("measured_speedup"), a.get("measured_speedup"))
            if ratio is None:
                missing[f"{task} {kind}"] = "measured on both sides, without a speedup on one"
            else:
                ratios.setdefault(kind, {})[task] = ratio
    names = {"eager": "baseline eager (null test)"}
    series = [RatioSeries(names.get(kind, f"baseline {kind} vs eager"), values)
              for kind, values in sorted(ratios.items())]
    return series, changes, missing, (len(kinds[0]), len(kinds[1]))


def compare_audits(earlier: Mapping[str, Any], new: Mapping[str, Any],
                   tolerance: float = DEFAULT_TOLERANCE) -> AuditComparison:
    """Compare two audit reports (`load_audit`) on the tasks they share; see the module docstring."""
    if not tolerance > 0:
        raise SourceError(f"tolerance must be > 0, not {tolerance}")
    a_rows, b_rows = _main_rows(earlier, "earlier"), _main_rows(new, "new")
    shared = sorted(set(a_rows) & set(b_rows))
    changes = {t: (str(a_rows[t].get("status")), str(b_rows[t].get("status"))) for t in shared
               if a_rows[t].get("status") != b_rows[t].get("status")}
    candidate: dict[str, float] = {}
    missing: dict[str, str] = {}
    for t in shared:
        if t in changes or a_rows[t].get("status") != "correct":
            continue
        ratio = _ratio(b_rows[t].get("speedup"), a_rows[t].get("speedup"))
        if ratio is None:
            missing[t] = "correct on both sides, without a speedup on one"
        else:
            candidate[t] = ratio
    series, baseline_changes, baseline_missing, baseline_kinds = _baseline_series(earlier, new, shared)
    published = [t for t in shared if a_rows[t].get("survives") is not None]
    survival = (len(published), sum(bool(a_rows[t]["survives"]) for t in published),
                sum(bool(b_rows[t].get("survives")) for t in published))
    metas = [m if isinstance(m := r.get("meta"), dict) else {} for r in (earlier, new)]
    protocols = [p if isinstance(p := m.get("protocol"), dict) else {} for m in metas]
    settings = {"machines": (str(metas[0].get("machine", "?")), str(metas[1].get("machine", "?"))),
                "profiles": (str(metas[0].get("profile", "?")), str(metas[1].get("profile", "?"))),
                "protocol versions": (str(protocols[0].get("version", "?")), str(protocols[1].get("version", "?")))}
    return AuditComparison(
        tolerance=tolerance, settings=settings, shared=shared,
        only_earlier=len(set(a_rows) - set(b_rows)), only_new=len(set(b_rows) - set(a_rows)),
        verdicts_agree=len(shared) - len(changes), verdict_changes=changes,
        series=[RatioSeries("candidate speedup vs eager", candidate), *series],
        baseline_status_changes=baseline_changes, missing={**missing, **baseline_missing},
        baseline_kinds=baseline_kinds, survival=survival)
