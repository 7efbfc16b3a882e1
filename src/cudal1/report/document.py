"""The content of a report as a list of format-neutral blocks (headings, paragraphs, tables, images).

`build_document` decides *what* a report says; `cudal1.report.render` decides how it looks in Markdown
or HTML. Keeping one content builder means the two formats cannot drift apart.

Sections: run metadata, conventions, summary tables per label, task origin and baseline (rows per level),
plots, verdict counts, kernel classes, flags, a table of every task, speed of light (when rows carry SOL
fractions) and an audit of published speedups (when rows carry published scores). Nothing here reads the clock or the environment:
the date and the machine come from `meta`, so the output is reproducible for a fixed input.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cudal1.core.baselines import published_key_by_baseline
from cudal1.metrics.aggregate import (
    ALL_LEVELS,
    audit_published,
    count_flags,
    count_kernel_classes,
    count_statuses,
    summarize_published,
    summarize_rows,
)
from cudal1.metrics.rows import ResultRow
from cudal1.metrics.summary import FAST_P_THRESHOLDS, SpeedupSummary, fast_p_name
from cudal1.report.plots import PlotSpec, has_sol

MISSING = "-"
ORIGINS = {"builtin": "built-in tasks", "kernelbench": "KernelBench", "file": "ad-hoc files",
           "request": "client references"}
OTHER_ORIGIN = "tasks"  # ids without a source prefix


@dataclass(frozen=True)
class Heading:
    text: str
    level: int  # 1 = title


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]
    numeric: list[bool] = field(default_factory=list)  # right-align these columns


@dataclass(frozen=True)
class Image:
    name: str  # file name under plots/
    caption: str


Block = Heading | Paragraph | Table | Image


def fmt_x(value: float | None) -> str:
    """A speedup or ratio with two decimals, or `-` when missing."""
    return MISSING if value is None else f"{value:.2f}"


def fmt_pct(value: float | None) -> str:
    """A fraction as a percentage with one decimal, or `-` when missing."""
    return MISSING if value is None else f"{100.0 * value:.1f}%"


def flag_list(flags: Sequence[str]) -> str:
    """Each rule once, in first-seen order, with its count when it fired more than once: "a x2, b"."""
    counts = Counter(flags)  # keeps first-seen order
    return ", ".join(f"{f} x{n}" if n > 1 else f for f, n in counts.items()) or MISSING


def fmt_level(level: int | str | None) -> str:
    """`all`, the level number, or `unknown`."""
    return "unknown" if level is None else str(level)


def _fmt_meta(value: Any) -> str:
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _natural_key(text: str) -> list[Any]:
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text) if t]


SUMMARY_HEADER = ["Mean", "Median", "Max", "P25", "P75", "Success", ">1.01x", "Geomean"]


def summary_cells(s: SpeedupSummary) -> list[str]:
    """The paper's columns for one summary, then fast_p (KernelBench) columns."""
    cells = [fmt_x(s.mean), fmt_x(s.median), fmt_x(s.max), fmt_x(s.p25), fmt_x(s.p75),
             f"{s.success}/{s.n_total}", f"{s.count_above_1_01}/{s.n_total}", fmt_x(s.geomean)]
    return cells + [fmt_pct(v) for v in s.fast_p.values()]


FAST_HEADER = [fast_p_name(p) for p in FAST_P_THRESHOLDS]


def _conventions(failures_as: float | None) -> Paragraph:
    fail = "excluded from" if failures_as is None else f"counted as {failures_as:g}x in"
    why = ("CUDA-L1's convention: the reference is kept" if failures_as == 1.0
           else "CUDA-L1 counts it as 1x: the reference is kept")
    return Paragraph(
        "Speedup = reference time / candidate time, per task. A task without a correct, measured "
        f"candidate is {fail} mean, median, max, P25 and P75 ({why}). Success and >1.01x count correct "
        "tasks out of all tasks. Geomean is over correct tasks only. fast_p (KernelBench) is the share of "
        "all tasks that are correct and faster than p x, so fast_0 is the correctness rate. Percentiles "
        "interpolate linearly. A baseline's table counts only the tasks that have that baseline measured "
        "(its heading says how many when that is not all of them).")


def task_origin(task_id: str) -> str:
    """Where a task comes from, by its id's first part: built-in suite, KernelBench, a user's file, a client's
    reference, or a release (named)."""
    if "/" not in task_id:
        return OTHER_ORIGIN
    head = task_id.split("/", 1)[0]
    return ORIGINS.get(head, f"release {head}")


def _origin_key(origin: str) -> tuple[int, str]:
    """Built-in and KernelBench first, then releases by name, then users' files and clients' references."""
    order = {"built-in tasks": 0, "KernelBench": 1, "ad-hoc files": 3, "client references": 4, OTHER_ORIGIN: 5}
    return order.get(origin, 2), origin


def _groups(rows: Sequence[ResultRow]) -> list[tuple[str, list[ResultRow]]]:
    """(title, rows) per run and per task origin: a summary never mixes built-in, release and ad-hoc tasks."""
    labels = sorted({r.label for r in rows})
    origins = sorted({task_origin(r.task_id) for r in rows}, key=_origin_key)
    out = []
    for label in labels:
        for origin in origins:
            mine = [r for r in rows if r.label == label and task_origin(r.task_id) == origin]
            parts = ([f"Run: {label or 'unlabelled'}"] if len(labels) > 1 else []) + ([origin] if len(origins) > 1 else [])
            if mine:
                out.append((", ".join(parts), mine))
    return out


def _summary_section(rows: Sequence[ResultRow], failures_as: float | None) -> list[Block]:
    groups = _groups(rows)
    blocks: list[Block] = [Heading("Summary", 2)]
    for title, group in groups:
        if len(groups) > 1:
            blocks.append(Heading(title, 3))
        records = summarize_rows(group, by=("level", "baseline"), failures_as=failures_as)
        for baseline in dict.fromkeys(rec.baseline for rec in records):
            recs = [rec for rec in records if rec.baseline == baseline]
            header = ["Level", *SUMMARY_HEADER, *FAST_HEADER]
            body = [[fmt_level(rec.level), *summary_cells(rec.summary)] for rec in recs]
            n = recs[0].summary.n_total  # the "all" group comes first
            scope = f" ({n} of {len(group)} tasks have this baseline measured)" if n < len(group) else ""
            blocks += [Heading(f"vs {baseline}{scope}", 4 if len(groups) > 1 else 3),
                       Table(header, body, [False] + [True] * (len(header) - 1))]
    return blocks


def _task_section(rows: Sequence[ResultRow]) -> list[Block]:
    """Every row: the table a user looks a task up in."""
    multi = len({r.label for r in rows}) > 1
    ordered = sorted(rows, key=lambda r: (r.label, _origin_key(task_origin(r.task_id)), r.level is None, r.level or 0,
                                          _natural_key(r.task_id)))
    header = (["Run"] if multi else []) + ["Task", "Origin", "Level", "Verdict", "Speedup", "Warm", "Kernel class",
                                           "Flags"]
    body = [([r.label or "unlabelled"] if multi else []) + [
        r.task_id, task_origin(r.task_id), fmt_level(r.level), r.status, fmt_x(r.speedup), fmt_x(r.speedup_warm),
        r.kernel_class or MISSING, flag_list(r.flags)] for r in ordered]
    return [Heading("Per task", 2), Table(header, body, [h in {"Speedup", "Warm"} for h in header])]


def _label_columns(rows: Sequence[ResultRow]) -> list[tuple[str, list[ResultRow]]]:
    labels = sorted({r.label for r in rows})
    return [(label or "rows", [r for r in rows if r.label == label]) for label in labels]


def _counts_table(first: str, columns: list[tuple[str, dict[str, int]]]) -> Table:
    keys = list(dict.fromkeys(k for _, counts in columns for k in counts))
    body = [[k, *[str(counts.get(k, 0)) for _, counts in columns]] for k in keys]
    return Table([first, *[name for name, _ in columns]], body, [False] + [True] * len(columns))


def _counts_section(rows: Sequence[ResultRow]) -> list[Block]:
    per_label = _label_columns(rows)
    blocks: list[Block] = [Heading("Verdicts", 2),
                           _counts_table("Status", [(n, count_statuses(rs)) for n, rs in per_label])]
    cols: list[tuple[str, dict[str, int]]] = []
    for name, rs in per_label:
        cols += [(f"{name}: all", count_kernel_classes(rs)), (f"{name}: correct",
                                                             count_kernel_classes(rs, correct_only=True))]
    blocks += [Heading("Kernel classes", 2), _counts_table("Kernel class", cols)]
    cols = []
    for name, rs in per_label:
        cols += [(f"{name}: all", count_flags(rs)), (f"{name}: correct", count_flags(rs, correct_only=True))]
    blocks.append(Heading("Flags", 2))
    if any(counts for _, counts in cols):
        blocks += [Paragraph("Rows carrying each rule (a rule counts once per row)."),
                   _counts_table("Rule", cols)]
    else:
        blocks.append(Paragraph("No flags raised."))
    return blocks


def _sol_section(rows: Sequence[ResultRow]) -> list[Block]:
    with_sol = [r for r in rows if has_sol(r)]
    if not with_sol:
        return []
    groups: list[tuple[int | str | None, list[ResultRow]]] = [(ALL_LEVELS, with_sol)]
    for level in sorted({r.level for r in with_sol}, key=lambda lv: (lv is None, lv or 0)):
        groups.append((level, [r for r in with_sol if r.level == level]))
    body = []
    for level, group in groups:
        ref = float(np.median([r.sol["reference"] for r in group]))
        cand = float(np.median([r.sol["candidate"] for r in group]))
        better = sum(r.sol["candidate"] > r.sol["reference"] for r in group)
        body.append([fmt_level(level), str(len(group)), fmt_pct(ref), fmt_pct(cand),
                     f"{better}/{len(group)}"])
    header = ["Level", "Tasks", "Median reference SOL", "Median candidate SOL", "Candidate closer"]
    return [Heading("Speed of light", 2),
            Paragraph("Fraction of the physical limit (FLOPs and minimum bytes vs the device's measured peaks), "
                      "correct tasks only."),
            Table(header, body, [False, True, True, True, True])]


def _audit_section(rows: Sequence[ResultRow], fraction: float, failures_as: float | None) -> list[Block]:
    if not any(r.published for r in rows):
        return []
    survival, compare = [], []
    for name, rs in _label_columns(rows):
        for baseline, key in published_key_by_baseline().items():
            audit = audit_published([r for r in rs if r.has_baseline(baseline)], baseline=baseline,
                                    fraction=fraction, published_key=key)
            if audit.n_published:
                measured = sum(e.speedup is not None for e in audit.entries)
                survival.append([name, baseline, key, str(audit.n_published), str(measured),
                                 str(audit.n_survive), fmt_pct(audit.n_survive / audit.n_published)])
        if any("score_default" in r.published for r in rs):
            # Both over every row of the run, so a task without a published score counts as a failure
            # on the published side exactly as the paper counted it.
            compare.append([f"{name}: published (score_default)",
                            *summary_cells(summarize_published(rs, failures_as=failures_as))])
            ours = summarize_rows(rs, by=(), failures_as=failures_as)[0].summary
            compare.append([f"{name}: ours (eager)", *summary_cells(ours)])
    blocks: list[Block] = [
        Heading("Audit of published speedups", 2),
        Paragraph(f"A published speedup survives when our verdict is correct and our speedup vs the same "
                  f"baseline is at least {fraction:g} x the published one. Measured: correct verdict with a "
                  f"speedup vs that baseline. Each baseline counts only the tasks that have it measured."),
        Table(["Run", "Baseline", "Published key", "Published", "Measured", "Survive", "Share"], survival,
              [False, False, False, True, True, True, True]),
    ]
    if compare:
        header = ["Source", *SUMMARY_HEADER, *FAST_HEADER]
        blocks += [Heading("Published vs ours (eager)", 3),
                   Table(header, compare, [False] + [True] * (len(header) - 1))]
    return blocks + _audit_task_table(rows, fraction)


def _audit_task_table(rows: Sequence[ResultRow], fraction: float) -> list[Block]:
    audit = audit_published(rows, baseline="eager", fraction=fraction)
    if not audit.n_published:
        return []
    multi = len({e.label for e in audit.entries}) > 1
    entries = sorted(audit.entries, key=lambda e: (e.label, e.level is None, e.level or 0,
                                                    _natural_key(e.task_id)))
    body = [([e.label] if multi else []) + [
        e.task_id, fmt_level(e.level), fmt_x(e.published), e.status, fmt_x(e.speedup), fmt_x(e.ratio),
        e.kernel_class or MISSING, flag_list(e.flags), "yes" if e.survives else "no",
    ] for e in entries]
    header = (["Run"] if multi else []) + ["Task", "Level", "Published", "Our verdict", "Our speedup",
                                           "Ratio", "Kernel class", "Flags", "Survives"]
    numeric = [h in {"Published", "Our speedup", "Ratio"} for h in header]
    return [Heading(f"Per task (vs eager, published key {audit.published_key})", 3),
            Table(header, body, numeric)]


def evaluations_section(evaluations: Sequence[Mapping[str, Any]]) -> list[Block]:
    """A table of every stored evaluation (rows as `ResultsStore.query_evaluations` returns them), oldest
    first: the summaries above count one row per task, this keeps each candidate and each re-evaluation."""
    if not evaluations:
        return []
    multi = len({e.get("label") or "" for e in evaluations}) > 1
    header = (["Run"] if multi else []) + ["Task", "Candidate", "Verdict", "Speedup", "Warm", "Device",
                                           "Measured"]
    body = [([e.get("label") or "unlabelled"] if multi else []) + [
        str(e["task_id"]), str(e.get("candidate_hash") or "")[:12], str(e["status"]), fmt_x(e.get("speedup")),
        fmt_x(e.get("speedup_warm")), str(e.get("gpu_name") or MISSING), str(e.get("created_at") or MISSING)]
        for e in evaluations]
    return [Heading(f"Every evaluation ({len(evaluations)})", 2),
            Paragraph("Each stored evaluation, oldest first: several candidates of a task, and "
                      "re-evaluations of one, each have their row here."),
            Table(header, body, [h in {"Speedup", "Warm"} for h in header])]


def build_document(rows: Sequence[ResultRow], *, title: str, meta: Mapping[str, Any],
                   plots: Sequence[PlotSpec] = (), failures_as: float | None = 1.0,
                   survive_fraction: float = 0.9) -> list[Block]:
    """Assemble the blocks of a report; `plots` lists the images to reference (none: no Plots section)."""
    blocks: list[Block] = [Heading(title, 1)]
    if meta:
        blocks.append(Table(["Setting", "Value"], [[str(k), _fmt_meta(v)] for k, v in meta.items()]))
    labels = sorted({r.label for r in rows})
    runs = ", ".join(label or "unlabelled" for label in labels) or "none"
    blocks += [Paragraph(f"{len(rows)} result rows, one per task and run (its best correct evaluation, else "
                         f"its newest); runs: {runs}."), _conventions(failures_as)]
    if not rows:
        return blocks + [Paragraph("No results to report.")]
    blocks += _summary_section(rows, failures_as)
    if plots:
        blocks.append(Heading("Plots", 2))
        blocks += [Image(p.name, p.caption) for p in plots]
    blocks += _counts_section(rows)
    blocks += _task_section(rows)
    blocks += _sol_section(rows)
    blocks += _audit_section(rows, survive_fraction, failures_as)
    return blocks
