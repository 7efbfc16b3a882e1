"""Audit published kernel collections on the local GPU, and build report rows from the results store.

    from cudal1.audit import AuditConfig, run_audit, write_audit_outputs
    outcome = run_audit(AuditConfig(release="h100.jsonl", chunk="1/4"), store)
    write_audit_outputs(outcome.rows, "out/audit", title="CUDA-L1 H100 audit", meta={})

Modules: `select` (which items), `run` (evaluate resumably through the store), `rows` (store -> report
rows with baselines and speed of light; also used by `cudal1 report`), `summary` (tables and files),
`compare` (does a re-run reproduce an earlier report: `compare_audits`), `explain` (which protocol change
explains a changed verdict).

An audit of every release, one GPU run at a time, without a store: `views` (every view's verdict, a profile
and a policy, from one evidence evaluation), `records` (the committed chunk records), `chunks` (plan and run the
next chunk; ingest), `static_half` (what the source alone says), `releases` (records -> per-release
verdicts), `pages` (the pages, rebuilt from the records alone).
"""

from cudal1.audit.compare import AuditComparison, compare_audits, load_audit
from cudal1.audit.rows import row_from_result, rows_from_store, sol_fractions, stored_labels
from cudal1.audit.run import AuditConfig, AuditOutcome, audit_label, audit_rows, run_audit
from cudal1.audit.select import chunk_items, parse_chunk, select_items
from cudal1.audit.summary import (
    audit_entries,
    profile_comparison,
    survival_table,
    tasks_markdown,
    write_audit_outputs,
)

__all__ = [
    "AuditComparison",
    "AuditConfig",
    "AuditOutcome",
    "audit_entries",
    "audit_label",
    "audit_rows",
    "chunk_items",
    "compare_audits",
    "parse_chunk",
    "load_audit",
    "profile_comparison",
    "row_from_result",
    "rows_from_store",
    "run_audit",
    "select_items",
    "sol_fractions",
    "stored_labels",
    "survival_table",
    "tasks_markdown",
    "write_audit_outputs",
]
