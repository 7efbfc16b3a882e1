"""An audit's report rebuilt from its saved `audit.json` alone, without the results store that produced it.

    from cudal1.audit.saved import report_saved_audit
    written = report_saved_audit("docs/audit/cuda-l1-h100-h200", "regenerated/", plots=False)

`audit.json` keeps, per task and label, what a report row needs: verdict, speedups vs eager (cold and warm
L2) and vs each baseline, kernel class, flags, speed-of-light fractions and published scores; and, in its
`baseline_coverage`, which baselines were measured for each task. `rows_from_saved` turns it back into
`ResultRow`s, and `report_saved_audit` writes report.md/html, plots, audit.json, audit_tasks.md and
audit_baselines.md from them, as `report_audit` does from a store.

Limits: the rows' reference and candidate times are not in `audit.json` (no report shows them); a row's
measured baselines come from `baseline_coverage`, which lists those of the audit's own protocol, also for
the rows of other profiles compared in the same report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal1.audit.compare import load_audit
from cudal1.audit.summary import write_audit_outputs
from cudal1.core.errors import SourceError
from cudal1.metrics.rows import ResultRow


@dataclass(frozen=True)
class SavedAudit:
    """A loaded `audit.json`: where it is, its document, and its rows."""

    path: Path
    data: dict[str, Any]
    rows: list[ResultRow]

    @property
    def label(self) -> str:
        return str(self.data.get("label") or "")

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.data.get("config") or {})

    @property
    def release_name(self) -> str:
        return Path(str(self.config.get("release") or (self.data.get("meta") or {}).get("release") or "")).stem

    @property
    def profile(self) -> str:
        return str(self.config.get("profile") or (self.data.get("meta") or {}).get("profile") or "")

    @property
    def fraction(self) -> float:
        return float(self.data.get("fraction", 0.9))

    @property
    def machine(self) -> str:
        return str((self.data.get("meta") or {}).get("machine") or "an unnamed machine")

    @property
    def gpu_name(self) -> str | None:
        return (self.config.get("environment") or {}).get("gpu_name")

    @property
    def own_rows(self) -> list[ResultRow]:
        """The rows of the audit's own label (not those of other profiles compared beside it)."""
        return [row for row in self.rows if row.label == self.label]

    @property
    def selected(self) -> int:
        return int((self.data.get("meta") or {}).get("selected", len(self.own_rows)))

    @property
    def pending(self) -> int:
        return int(self.data.get("pending", 0))

    def check(self, *, release: str | Path | None = None, profile: str | None = None,
              gpu: str | None = None) -> SavedAudit:
        """Itself, unless a given release (path or name), profile or GPU name is not the audit's: then a
        one-line `SourceError` (a report of other results would silently answer another question)."""
        if release is not None and Path(release).stem != self.release_name:
            raise SourceError(f"{self.path} is the audit of release {self.release_name!r}, not {Path(release).stem!r}")
        if profile is not None and profile != self.profile:
            raise SourceError(f"{self.path} is the audit under profile {self.profile!r}, not {profile!r}")
        if gpu is not None and gpu != self.gpu_name:
            raise SourceError(f"{self.path} holds results measured on {self.machine}, not on {gpu!r}")
        return self


def saved_audit_path(path: str | Path) -> Path:
    """`path` itself, or the `audit.json` of the report folder it names."""
    where = Path(path)
    return where / "audit.json" if where.is_dir() else where


def load_saved_audit(path: str | Path) -> SavedAudit:
    """The audit report at `path` (an `audit.json` or its folder) with its rows; `SourceError` (one line)
    when it is missing, not an audit report, or a task entry lacks what a row needs."""
    where = saved_audit_path(path)
    data = load_audit(where)
    return SavedAudit(path=where, data=data, rows=rows_from_saved(data, where))


def rows_from_saved(data: Mapping[str, Any], where: str | Path = "audit.json") -> list[ResultRow]:
    """One `ResultRow` per task entry of an `audit.json` document (`audit_entries`' output, inverted)."""
    per_task = (data.get("baseline_coverage") or {}).get("per_task")
    rows = []
    for i, entry in enumerate(data.get("tasks") or []):
        try:
            rows.append(_row(entry, per_task))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise SourceError(f"{where}: task entry {i} is not a report row ({type(exc).__name__}: {exc})") from None
    return rows


def _row(entry: Mapping[str, Any], per_task: Mapping[str, Any] | None) -> ResultRow:
    speedup_vs = dict(entry.get("speedup_vs") or {})
    measured = None
    if per_task is not None:  # what the store held for this task when the audit was written
        records = per_task.get(entry["task_id"]) or {}
        measured = tuple(sorted(kind for kind, record in records.items() if record.get("status") == "ok"))
    return ResultRow(task_id=str(entry["task_id"]), level=entry.get("level"), status=entry["status"],
                     speedup=entry.get("speedup"), speedup_warm=entry.get("speedup_warm"),
                     baselines={k: v for k, v in speedup_vs.items() if k != "eager"},
                     kernel_class=entry.get("kernel_class"), flags=list(entry.get("flags") or []),
                     published=dict(entry.get("published") or {}), sol=dict(entry.get("sol") or {}),
                     label=str(entry.get("label") or ""), measured_baselines=measured)


def report_saved_audit(saved: SavedAudit | str | Path, out_dir: str | Path, *, plots: bool = True) -> dict[str, Path]:
    """Write the report of a saved audit into `out_dir` (see `write_audit_outputs`); return name -> path.
    Nothing is evaluated or looked up: the rows, settings and baseline coverage all come from the file."""

    if not isinstance(saved, SavedAudit):
        saved = load_saved_audit(saved)
    data = saved.data
    extra = {key: data[key] for key in ("config", "pending", "label") if key in data}
    coverage = data.get("baseline_coverage") or None
    return write_audit_outputs(saved.rows, out_dir, title=str(data.get("title") or "Audit"),
                               meta=dict(data.get("meta") or {}), fraction=saved.fraction, plots=plots,
                               extra=extra, coverage=coverage)


__all__ = ["SavedAudit", "load_saved_audit", "report_saved_audit", "rows_from_saved", "saved_audit_path"]
