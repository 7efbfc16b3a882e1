"""Tables over result rows: summaries per level and baseline, status/kernel-class/flag counts, audits.

`summarize_rows` groups `ResultRow`s by level ("all" plus each level), by baseline (eager plus every
baseline some row measured) and optionally by label, and summarizes each group with
`cudal1.metrics.summary.summarize`. Every row of a group counts in `n_total`: a row that is not correct, or
that has no measurement for that baseline, is a failure for that baseline.

`audit_published` checks published speedups (for example the CUDA-L1 release) against our verdicts: a
published speedup *survives* when our verdict is correct and our speedup is at least `fraction` (default
0.9) of the published one.

Limits: rows are assumed to be one per task per label; nothing here deduplicates them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cudal1.core.baselines import published_key_by_baseline, reported_baseline_names
from cudal1.core.types import KernelClass, Status
from cudal1.metrics.rows import EAGER_WARM, ResultRow
from cudal1.metrics.summary import SpeedupSummary, summarize

ALL_LEVELS = "all"
_GROUP_KEYS = frozenset({"level", "baseline", "label"})


@dataclass(frozen=True)
class SummaryRecord:
    """One line of a summary table: which rows (label, level) against which baseline, and their stats."""

    label: str | None  # None when not grouped by label
    level: int | str | None  # "all", a level number, or None for rows without a level
    baseline: str
    summary: SpeedupSummary

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict: the group keys followed by the summary's numbers."""
        return {"label": self.label, "level": self.level, "baseline": self.baseline, **self.summary.to_dict()}


def baselines_present(rows: Iterable[ResultRow]) -> list[str]:
    """Eager, then every baseline any row measured, in report order (`reported_baseline_names`), then others
    sorted.

    `eager_warm` is included (after eager) when any row has a warm speedup.
    """
    seen: set[str] = set()
    warm = False
    for row in rows:
        seen.update(row.baselines)
        warm = warm or row.speedup_warm is not None
    ordered = ["eager"] + ([EAGER_WARM] if warm else [])
    known = reported_baseline_names()
    ordered += [b for b in known if b in seen and b != "eager"]
    ordered += sorted(seen - set(known) - {EAGER_WARM})
    return ordered


def _level_sort_key(level: int | None) -> tuple[int, int]:
    return (1, 0) if level is None else (0, int(level))


def summarize_rows(rows: Sequence[ResultRow], by: Sequence[str] = ("level", "baseline"), *,
                   failures_as: float | None = 1.0,
                   baselines: Sequence[str] | None = None) -> list[SummaryRecord]:
    """Summarize rows per group in the paper's table format.

    Args:
        rows: one row per task (per label).
        by: any of "level" (adds one group per level after "all"), "baseline" (every baseline present,
            or `baselines`; without it only eager) and "label" (one block per label, sorted).
        failures_as: passed to `summarize` (1.0, the paper's convention, by default).
        baselines: baselines to report; defaults to `baselines_present(rows)`.

    Returns:
        Records ordered by label, then baseline, then level ("all" first, then ascending, None last).
    """
    unknown = set(by) - _GROUP_KEYS
    if unknown:
        raise ValueError(f"summarize_rows: cannot group by {sorted(unknown)}; "
                         f"use any of {sorted(_GROUP_KEYS)}")
    if baselines is None:
        baselines = baselines_present(rows) if "baseline" in by else ["eager"]
    labels: list[str | None] = sorted({r.label for r in rows}) if "label" in by else [None]
    records: list[SummaryRecord] = []
    for label in labels:
        in_label = [r for r in rows if label is None or r.label == label]
        groups: list[tuple[int | str | None, list[ResultRow]]] = [(ALL_LEVELS, in_label)]
        if "level" in by:
            for level in sorted({r.level for r in in_label}, key=_level_sort_key):
                groups.append((level, [r for r in in_label if r.level == level]))
        for baseline in baselines:
            for level, group in groups:
                # Only the tasks that have this baseline: a partial run (a sample) is not a row of 1x.
                values = [r.speedup_vs(baseline) for r in group if r.has_baseline(baseline)]
                records.append(SummaryRecord(label=label, level=level, baseline=baseline,
                                             summary=summarize(values, failures_as=failures_as)))
    return records


def count_statuses(rows: Iterable[ResultRow]) -> dict[str, int]:
    """Rows per status, every verdict `Status` listed (zeros included) in the enum's order."""
    counts = Counter(r.status for r in rows)
    return {s.value: counts.get(s.value, 0) for s in Status if s.is_verdict}


def count_kernel_classes(rows: Iterable[ResultRow], *, correct_only: bool = False) -> dict[str, int]:
    """Rows per kernel class in `KernelClass` order (zeros included), then others, then `unknown` (None)."""
    counts = Counter(r.kernel_class or "unknown" for r in rows if r.is_correct or not correct_only)
    known = [k.value for k in KernelClass]
    out = {k: counts.get(k, 0) for k in known}
    out.update({k: counts[k] for k in sorted(counts) if k not in known and k != "unknown"})
    if counts.get("unknown"):
        out["unknown"] = counts["unknown"]
    return out


def count_flags(rows: Iterable[ResultRow], *, correct_only: bool = False) -> dict[str, int]:
    """Rows carrying each flag rule (a rule counts once per row), most frequent first, ties by name."""
    counts = Counter(rule for r in rows if r.is_correct or not correct_only for rule in set(r.flags))
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass(frozen=True)
class AuditEntry:
    """One task of an audit: the published speedup next to our verdict."""

    task_id: str
    level: int | None
    label: str
    published: float
    status: str
    speedup: float | None
    ratio: float | None  # our speedup / published speedup
    kernel_class: str | None
    flags: list[str]
    survives: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class AuditSummary:
    """How many published speedups survive re-evaluation, with the per-task evidence."""

    baseline: str
    published_key: str
    fraction: float
    entries: list[AuditEntry] = field(default_factory=list)

    @property
    def n_published(self) -> int:
        """Tasks with a published score under `published_key`."""
        return len(self.entries)

    @property
    def n_survive(self) -> int:
        """Published speedups that survive."""
        return sum(e.survives for e in self.entries)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"baseline": self.baseline, "published_key": self.published_key, "fraction": self.fraction,
                "n_published": self.n_published, "n_survive": self.n_survive,
                "entries": [e.to_dict() for e in self.entries]}


def audit_published(rows: Sequence[ResultRow], *, baseline: str = "eager", fraction: float = 0.9,
                    published_key: str | None = None) -> AuditSummary:
    """Check each published speedup against our verdict and speedup vs the same baseline.

    A published speedup survives when our verdict is correct and our speedup vs `baseline` is at least
    `fraction` x the published one. Rows without a published score under `published_key` (default: the
    CUDA-L1 release key of `baseline`, e.g. `score_default` for eager) are left out of the audit.
    """
    if not fraction > 0:
        raise ValueError(f"audit_published: fraction must be > 0, got {fraction}")
    key = published_key or published_key_by_baseline().get(baseline)
    if key is None:
        raise ValueError(f"audit_published: no published key known for baseline {baseline!r}; "
                         f"pass published_key=")
    entries = []
    for row in rows:
        published = row.published.get(key)
        if published is None:
            continue
        ours = row.speedup_vs(baseline)
        ratio = ours / published if ours is not None and published > 0 else None
        entries.append(AuditEntry(
            task_id=row.task_id, level=row.level, label=row.label, published=float(published),
            status=row.status, speedup=ours, ratio=ratio, kernel_class=row.kernel_class,
            flags=list(row.flags), survives=ours is not None and ours >= fraction * published,
        ))
    return AuditSummary(baseline=baseline, published_key=key, fraction=fraction, entries=entries)


def summarize_published(rows: Sequence[ResultRow], published_key: str = "score_default", *,
                        failures_as: float | None = 1.0) -> SpeedupSummary:
    """Summarize the published scores themselves (a missing score is a failure), to compare with ours."""
    return summarize([r.published.get(published_key) for r in rows], failures_as=failures_as)
