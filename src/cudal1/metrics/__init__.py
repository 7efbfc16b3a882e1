"""Metrics over evaluation results: the CUDA-L1 paper's speedup table, KernelBench fast_p, audits.

Start from `ResultRow` (one task's outcome), then `summarize` one list of speedups or `summarize_rows`
a whole run per level and baseline; `audit_published` checks published speedups against ours.
"""

from cudal1.metrics.aggregate import (
    ALL_LEVELS,
    AuditEntry,
    AuditSummary,
    SummaryRecord,
    audit_published,
    baselines_present,
    count_flags,
    count_kernel_classes,
    count_statuses,
    summarize_published,
    summarize_rows,
)
from cudal1.metrics.rows import EAGER_WARM, ResultRow
from cudal1.metrics.summary import FAST_P_THRESHOLDS, SPEEDUP_MARGIN, SpeedupSummary, fast_p_name, summarize

__all__ = [
    "ALL_LEVELS",
    "EAGER_WARM",
    "FAST_P_THRESHOLDS",
    "SPEEDUP_MARGIN",
    "AuditEntry",
    "AuditSummary",
    "ResultRow",
    "SpeedupSummary",
    "SummaryRecord",
    "audit_published",
    "baselines_present",
    "count_flags",
    "count_kernel_classes",
    "count_statuses",
    "fast_p_name",
    "summarize",
    "summarize_published",
    "summarize_rows",
]
