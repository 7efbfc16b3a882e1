"""Result rows: the flat, per-task input of the metrics and the reports.

A `ResultRow` is one task's outcome for one run (a model, a profile, a published collection): its verdict,
its speedups against each baseline, its kernel class and flags, and, for audits, the scores that were
published for it. Rows are built from `EvalResult.to_dict()` output (`ResultRow.from_eval_dict`) or by hand.

Limits: one row per task per `label` is assumed; the metrics do not deduplicate or pick a best candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from cudal1.core.types import Status

#: Pseudo-baseline: speedup over eager without the L2 flush (CUDA-L1's own timing condition).
EAGER_WARM = "eager_warm"

_STATUS_VALUES = frozenset(s.value for s in Status)


def _bad_speedup(value: Any) -> bool:
    return isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0


def unusable(d: dict[str, Any]) -> str | None:
    """Why a stored verdict (`EvalResult.to_dict()` output) cannot be a report row, or None: an unknown status,
    or a correct verdict whose speedup (vs eager, warm, or vs a baseline) is missing, not finite or not > 0.
    The metrics refuse such speedups; a report skips the row and says how many it skipped, and why."""
    status = d.get("status")
    if status not in _STATUS_VALUES:
        return f"status {status!r} is not one of the statuses"
    if status != Status.CORRECT.value:
        return None
    timing = d.get("timing") or {}
    figures = {"speedup": d.get("speedup"), "speedup_warm": d.get("speedup_warm", timing.get("speedup_warm")),
               **{f"baselines.{k}": v for k, v in (d.get("baselines") or {}).items()}}
    for name, value in figures.items():
        if (value is not None or name == "speedup") and _bad_speedup(value):
            return f"a correct verdict with {name} {value!r}"
    return None


@dataclass(frozen=True)
class ResultRow:
    """One task's outcome in one run, flattened for tables and plots.

    `speedup` is vs eager with a cold cache and is None unless the verdict is correct; `baselines` maps a
    baseline name (a kind of `cudal1.core.baselines`) to the candidate's speedup vs that baseline; `sol` maps
    `reference`, `candidate` or a baseline name to a speed-of-light fraction in [0, 1]; `published` holds
    published scores for audits (CUDA-L1 release keys such as `score_default`).
    """

    task_id: str
    level: int | None = None
    status: str = Status.CORRECT.value
    speedup: float | None = None
    speedup_warm: float | None = None
    baselines: dict[str, float] = field(default_factory=dict)
    kernel_class: str | None = None
    flags: list[str] = field(default_factory=list)
    published: dict[str, float] = field(default_factory=dict)
    sol: dict[str, float] = field(default_factory=dict)
    ref_ms: float | None = None
    candidate_ms: float | None = None
    label: str = ""
    measured_baselines: tuple[str, ...] | None = None  # baselines measured for this task on its machine;
    # None: not known, and every baseline's summary counts the row (eager is always measured)

    def __post_init__(self) -> None:
        status = self.status.value if isinstance(self.status, Status) else self.status
        if status not in _STATUS_VALUES:
            raise ValueError(f"ResultRow {self.task_id!r}: status {self.status!r} is not one of "
                             f"{sorted(_STATUS_VALUES)}")
        object.__setattr__(self, "status", status)
        for name, frac in self.sol.items():
            if frac is not None and not (0.0 <= frac <= 1.0 or math.isnan(frac)):
                raise ValueError(f"ResultRow {self.task_id!r}: sol[{name!r}] = {frac} is outside [0, 1]")

    @property
    def is_correct(self) -> bool:
        """True when the verdict is `correct`."""
        return self.status == Status.CORRECT.value

    def has_baseline(self, baseline: str) -> bool:
        """Whether the task has `baseline` measured (or it is not known: then assume so)."""
        return (self.measured_baselines is None or baseline in ("eager", EAGER_WARM)
                or baseline in self.measured_baselines)

    def speedup_vs(self, baseline: str) -> float | None:
        """Speedup of the candidate vs `baseline` (or `eager_warm`); None unless correct, or unmeasured."""
        if not self.is_correct:
            return None
        if baseline == "eager":
            return self.speedup if self.speedup is not None else self.baselines.get("eager")
        if baseline == EAGER_WARM:
            return self.speedup_warm
        return self.baselines.get(baseline)

    @classmethod
    def from_eval_dict(cls, d: dict[str, Any], level: int | None = None,
                       published: dict[str, float] | None = None, *, label: str = "",
                       sol: dict[str, float] | None = None,
                       measured_baselines: tuple[str, ...] | None = None) -> ResultRow:
        """Build a row from `EvalResult.to_dict()` output.

        `level`, `label` and `sol` fall back to keys of the same name in `d` when not given; flags become
        their rule names. Speedups of a non-correct verdict are dropped (set to None).
        """
        status = Status(d["status"]).value
        correct = status == Status.CORRECT.value
        flags = [f["rule"] if isinstance(f, dict) else str(f) for f in d.get("flags") or []]
        speedup_warm = d.get("speedup_warm")
        if speedup_warm is None and d.get("timing"):
            speedup_warm = d["timing"].get("speedup_warm")
        return cls(
            task_id=str(d.get("task_id", "")),
            level=level if level is not None else d.get("level"),
            status=status,
            speedup=d.get("speedup") if correct else None,
            speedup_warm=speedup_warm if correct else None,
            baselines=dict(d.get("baselines") or {}) if correct else {},
            kernel_class=d.get("kernel_class"),
            flags=flags,
            published=dict(published or d.get("published") or {}),
            sol=dict(sol if sol is not None else d.get("sol") or {}),
            ref_ms=d.get("ref_ms"),
            candidate_ms=d.get("candidate_ms"),
            label=label or str(d.get("label") or ""),
            measured_baselines=measured_baselines,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (inverse of `from_dict`)."""
        return {
            "task_id": self.task_id, "level": self.level, "status": self.status, "speedup": self.speedup,
            "speedup_warm": self.speedup_warm, "baselines": dict(self.baselines),
            "kernel_class": self.kernel_class, "flags": list(self.flags), "published": dict(self.published),
            "sol": dict(self.sol), "ref_ms": self.ref_ms, "candidate_ms": self.candidate_ms,
            "label": self.label,
            "measured_baselines": None if self.measured_baselines is None else list(self.measured_baselines),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResultRow:
        """Rebuild a row written by `to_dict`; unknown keys are ignored."""
        known = set(cls.__dataclass_fields__)
        kept = {k: v for k, v in d.items() if k in known}
        if kept.get("measured_baselines") is not None:
            kept["measured_baselines"] = tuple(kept["measured_baselines"])
        return cls(**kept)
