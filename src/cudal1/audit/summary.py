"""What an audit says: per-task verdicts next to the published scores, survival counts, profile comparison.

`audit_entries` gives one dict per task (every published score, our verdict, our speedup vs eager and vs
each baseline, kernel class, flags, and whether the published speedup vs eager survives); `survival_table`
counts survivors per kernel class or per flag; `profile_comparison` puts the runs of several profiles (or
releases) side by side. `write_audit_outputs` writes the standard report (`cudal1.report.write_report`,
all labels given) plus `audit.json`, `audit_tasks.md` (the per-task table with every baseline) and
`audit_baselines.md` (every stored baseline's time per task).

A published speedup *survives* when our verdict is correct and our speedup vs the same baseline is at least
`fraction` x the published one (`cudal1.metrics.audit_published`'s rule).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cudal1.baselines import BaselineRecord, baseline_cell
from cudal1.core.baselines import baseline_kind_names, published_key_by_baseline
from cudal1.metrics.aggregate import baselines_present, summarize_rows
from cudal1.metrics.rows import ResultRow
from cudal1.report import write_report
from cudal1.report.document import Block, Heading, Paragraph, Table, flag_list


def _survives(row: ResultRow, baseline: str, fraction: float) -> bool | None:
    published = row.published.get(published_key_by_baseline().get(baseline, ""))
    if published is None:
        return None
    ours = row.speedup_vs(baseline)
    return ours is not None and ours >= fraction * published


def audit_entries(rows: Sequence[ResultRow], fraction: float = 0.9) -> list[dict[str, Any]]:
    """One JSON-ready dict per row: published scores, our verdict and speedups, survival per baseline."""
    entries = []
    for row in rows:
        baselines = [b for b in baselines_present([row]) if b != "eager_warm"]
        survives = {b: _survives(row, b, fraction) for b in published_key_by_baseline()}
        entries.append({
            "task_id": row.task_id, "level": row.level, "label": row.label, "published": dict(row.published),
            "status": row.status, "speedup": row.speedup, "speedup_warm": row.speedup_warm,
            "speedup_vs": {b: row.speedup_vs(b) for b in baselines}, "kernel_class": row.kernel_class,
            "flags": list(row.flags), "sol": dict(row.sol), "survives": survives.get("eager"),
            "survives_vs": {b: v for b, v in survives.items() if v is not None},
        })
    return entries


def survival_table(rows: Sequence[ResultRow], by: str, fraction: float = 0.9) -> dict[str, dict[str, int]]:
    """Per kernel class (`by="kernel_class"`) or per flag rule (`by="flag"`): rows, correct, published, survive."""
    if by not in ("kernel_class", "flag"):
        raise ValueError("survival_table: by must be 'kernel_class' or 'flag'")
    table: dict[str, dict[str, int]] = defaultdict(lambda: {"rows": 0, "correct": 0, "published": 0,
                                                            "survive": 0})
    for row in rows:
        keys = [row.kernel_class or "unknown"] if by == "kernel_class" else sorted(set(row.flags)) or ["(none)"]
        verdict = _survives(row, "eager", fraction)
        for key in keys:
            cell = table[key]
            cell["rows"] += 1
            cell["correct"] += row.is_correct
            cell["published"] += verdict is not None
            cell["survive"] += bool(verdict)
    return dict(sorted(table.items(), key=lambda kv: (-kv[1]["rows"], kv[0])))


#: The flag a result carries when the candidate's own code caught its failed build and ran its fallback.
FALLBACK_FLAG = "runtime.custom_build_failed"
_OUTCOMES = ("correct", "incorrect", "compile_error", "runtime_error", "timeout", "hack_detected", "infra_error")


def outcome_table(rows: Sequence[ResultRow]) -> list[dict[str, Any]]:
    """One line per label: how many kernels are correct, incorrect, unbuildable, crashing, slow or rejected;
    of the correct and incorrect ones, how many run a fallback because their CUDA never built (published CUDA
    that never builds, counted apart); of the rejected ones, the flags they carry (most frequent first)."""
    out = []
    for label in sorted({r.label for r in rows}):
        mine = [r for r in rows if r.label == label]
        line: dict[str, Any] = {"label": label, "tasks": len(mine)}
        line.update({status: sum(r.status == status for r in mine) for status in _OUTCOMES})
        line["other"] = len(mine) - sum(line[s] for s in _OUTCOMES)
        for status in ("correct", "incorrect"):
            line[f"{status}_cuda_never_built"] = sum(r.status == status and FALLBACK_FLAG in r.flags for r in mine)
        rejected: dict[str, int] = defaultdict(int)
        for row in mine:
            for rule in set(row.flags) if row.status == "hack_detected" else ():
                rejected[rule] += 1
        line["rejected_flags"] = dict(sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0])))
        out.append(line)
    return out


def outcome_blocks(outcomes: Sequence[Mapping[str, Any]]) -> list[Block]:
    """The outcome table as a report section."""
    body = [[o["label"], str(o["tasks"]), f"{o['correct']} ({o['correct_cuda_never_built']})",
             f"{o['incorrect']} ({o['incorrect_cuda_never_built']})", str(o["compile_error"]),
             str(o["runtime_error"] + o["timeout"]), str(o["hack_detected"]),
             ", ".join(f"{rule} {n}" for rule, n in list(o["rejected_flags"].items())[:4]) or "-",
             str(o["infra_error"] + o["other"])] for o in outcomes]
    header = ["Run", "Tasks", "Correct (CUDA never built)", "Incorrect (CUDA never built)", "Unbuildable",
              "Crash or timeout", "Rejected", "Flags on rejected kernels", "Not judged"]
    return [Heading("Outcomes", 2),
            Paragraph("Every kernel's verdict. In brackets: kernels whose own code caught the failed build of "
                      "their CUDA and ran a fallback instead (judged for what runs, counted apart). Not judged: "
                      "the evaluation or the reference failed (infra_error), or not evaluated."),
            Table(header, body, [False, True, True, True, True, True, True, False, True])]


def profile_comparison(rows: Sequence[ResultRow], fraction: float = 0.9) -> list[dict[str, Any]]:
    """One line per label: rows, correct, published speedups that survive, mean/median/geomean vs eager."""
    out = []
    for label in sorted({r.label for r in rows}):
        mine = [r for r in rows if r.label == label]
        summary = summarize_rows(mine, by=())[0].summary
        verdicts = [_survives(r, "eager", fraction) for r in mine]
        out.append({"label": label, "rows": len(mine), "correct": summary.success,
                    "published": sum(v is not None for v in verdicts), "survive": sum(bool(v) for v in verdicts),
                    "mean": summary.mean, "median": summary.median, "geomean": summary.geomean})
    return out


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def tasks_markdown(entries: Sequence[dict[str, Any]], title: str) -> str:
    """The per-task table: published vs ours for every baseline, verdict, class, flags, survival."""
    keys = published_key_by_baseline()
    baselines = [b for b, key in keys.items() if any(b in e["speedup_vs"] or key in e["published"] for e in entries)]
    labels = len({e["label"] for e in entries}) > 1
    header = (["Run"] if labels else []) + ["Task", "Level", "Verdict"] + [
        f"vs {b} (ours / published)" for b in baselines] + ["Kernel class", "Flags", "Survives"]
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for e in entries:
        cells = ([e["label"]] if labels else []) + [e["task_id"], str(e["level"]), e["status"]]
        cells += [f"{_x(e['speedup_vs'].get(b))} / {_x(e['published'].get(keys[b]))}"
                  for b in baselines]
        survives = e["survives"]
        cells += [e["kernel_class"] or "-", flag_list(e["flags"]).replace("|", "/"),
                  "-" if survives is None else ("yes" if survives else "no")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def coverage_blocks(coverage: Mapping[str, Any]) -> list[Block]:
    """The report section of `baseline_coverage`: per kind, tasks measured, failed, not measured yet (out
    of the tasks it was asked for, when known); then every failure with its reason (e.g. a reference whose
    CUDA graph capture is illegal)."""
    n = coverage["tasks"]
    with_asked = all("asked" in c for c in coverage["kinds"].values())
    scope = ("each baseline counts the tasks it was asked for" if with_asked
             else "not measured means left for a later run, or not asked for these tasks")
    header = ["Baseline", *(["Asked"] if with_asked else []), "Measured", "Failed", "Not measured"]
    rows = [[kind, *([str(c["asked"])] if with_asked else []), str(c["measured"]), str(c["failed"]),
             str(c["not_measured"])] for kind, c in coverage["kinds"].items()
            if not with_asked or c["asked"]]  # kinds nobody asked for are left out
    blocks: list[Block] = [
        Heading("Baselines measured", 2),
        Paragraph(f"Of the {n} distinct tasks of the selection ({scope}): a baseline is measured (correct, "
                  "timed), failed (the reason is listed below) or not measured yet. Eager needs no row: every "
                  "evaluation times the reference beside its candidate."
                  + (" Each baseline's time per task: audit_baselines.md." if coverage.get("per_task") else "")),
        Table(header, rows)]
    if coverage.get("null_test_summary"):
        blocks += [Heading("Protocol null test", 3), Paragraph(coverage["null_test_summary"])]
    if coverage["failures"]:
        blocks += [Heading("Baseline failures", 3),
                   Table(["Task", "Baseline", "Reason"],
                         [[f["task_id"], f["baseline"], f["reason"]] for f in coverage["failures"]])]
    return blocks


#: Band of "agrees" for our baseline's speedup vs eager over the one a release implies (x 1.25 either way).
AGREEMENT_BAND = 1.25


def implied_baselines(rows: Sequence[ResultRow], per_task: Mapping[str, Mapping[str, Mapping[str, Any]]]
                      ) -> list[dict[str, Any]]:
    """Our baselines next to the ones a release implies. A release that scores one candidate against eager
    (`score_default` = t_eager / t_cand) and against a baseline (`score_<kind>` = t_kind / t_cand) implies that
    baseline's speedup vs eager: score_default / score_<kind>. Per kind, over the tasks where we measured the
    baseline and the release scores both: the medians of ours and of the implied speedups, the median of
    ours / implied, and how many tasks agree within `AGREEMENT_BAND`. A median of ours / implied near 1 with
    most tasks in the band says both sides measured the same baseline, so a published speedup that falls
    against it falls because of the candidate; close medians of the speedups alone do not say that."""
    published = {row.task_id: row.published for row in rows}
    out = []
    for kind, key in published_key_by_baseline().items():
        if kind == "eager":
            continue
        ours, implied = [], []
        for task_id, by_kind in per_task.items():
            mine = (by_kind.get(kind) or {}).get("speedup_vs_eager")
            scores = published.get(task_id) or {}
            default, theirs = scores.get("score_default"), scores.get(key)
            if mine and default and theirs and default > 0 and theirs > 0:
                ours.append(float(mine))
                implied.append(default / theirs)
        if not ours:
            continue
        ratios = [a / b for a, b in zip(ours, implied, strict=True)]
        out.append({"baseline": kind, "published_key": key, "tasks": len(ours),
                    "ours_median": statistics.median(ours), "implied_median": statistics.median(implied),
                    "ratio_median": statistics.median(ratios),
                    "agree": sum(1 / AGREEMENT_BAND <= r <= AGREEMENT_BAND for r in ratios)})
    return out


def implied_blocks(agreement: Sequence[Mapping[str, Any]]) -> list[Block]:
    """The report section of `implied_baselines`."""
    if not agreement:
        return []
    return [Heading("Our baselines vs the release's", 3),
            Paragraph("Each published candidate is scored against eager and against each baseline, so the release "
                      "implies every baseline's speedup vs eager (score_default / score_<baseline>). Per "
                      "baseline, over the tasks where both exist: medians of ours and of the implied speedups, "
                      f"the median of ours / implied, and the tasks that agree within x{AGREEMENT_BAND:g}. "
                      "Agreement is read from the last two columns: two distributions can share a median while "
                      "differing task by task."),
            Table(["Baseline", "Tasks", "Ours (median)", "Implied (median)", "Ours / implied (median)", "Agree"],
                  [[a["baseline"], str(a["tasks"]), f"{a['ours_median']:.2f}x", f"{a['implied_median']:.2f}x",
                    f"{a['ratio_median']:.2f}", f"{a['agree']}/{a['tasks']}"] for a in agreement])]


def baselines_markdown(per_task: Mapping[str, Mapping[str, Mapping[str, Any]]], title: str) -> str:
    """Every stored baseline per task (`baseline_coverage`'s `per_task`), in the cells `cudal1 baseline`
    prints: ms (speedup vs eager), failed with the start of its reason, or '-'. Tasks without any stored
    baseline have no row; the columns are the known kinds that some task has."""

    kinds = [k for k in baseline_kind_names() if any(k in by_kind for by_kind in per_task.values())]
    lines = [f"# {title}", "",
             "Median time per call in ms, cold cache, and in brackets the speedup vs eager measured beside it "
             "(eager is 1.00x by definition; its measured ratio against itself is the report's null test). "
             "Failures name the start of their reason; the report lists it whole.", "",
             "| " + " | ".join(["Task", *kinds]) + " |", "|" + "|".join("---" for _ in range(len(kinds) + 1)) + "|"]
    for task_id, by_kind in per_task.items():
        cells = []
        for kind in kinds:
            found = by_kind.get(kind)
            record = None if found is None else BaselineRecord(
                task_id=task_id, task_hash="", name=kind, status=found.get("status", "failed"),
                ms=found.get("ms"), speedup_vs_eager=found.get("speedup_vs_eager"), reason=found.get("reason", ""))
            cells.append(baseline_cell(record, reason_chars=160).replace("|", "/"))
        lines.append("| " + " | ".join([task_id, *cells]) + " |")
    return "\n".join(lines) + "\n"


def write_audit_outputs(rows: Sequence[ResultRow], out_dir: str | Path, *, title: str, meta: Mapping[str, Any],
                        fraction: float = 0.9, plots: bool = True, extra: Mapping[str, Any] | None = None,
                        coverage: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """Write report.md/html (+plots), audit.json and audit_tasks.md under `out_dir`; return name -> path.
    `coverage` (`baseline_coverage`) adds the section of which baselines were measured, goes into audit.json,
    and its stored baselines per task into audit_baselines.md."""
    out = Path(out_dir)
    agreement = implied_baselines(rows, coverage.get("per_task") or {}) if coverage else []
    outcomes = outcome_table(rows)
    blocks = [*outcome_blocks(outcomes), *((*coverage_blocks(coverage), *implied_blocks(agreement)) if coverage else ())]
    written = write_report(rows, out, title=title, meta=meta, plots=plots, survive_fraction=fraction,
                           extra_blocks=blocks)
    extra = {**dict(extra or {}), **({"baseline_coverage": dict(coverage), "implied_baselines": agreement}
                                     if coverage else {})}
    entries = audit_entries(rows, fraction)
    document = {"title": title, "meta": dict(meta), "fraction": fraction, **dict(extra or {}),
                "comparison": profile_comparison(rows, fraction), "outcomes": outcomes,
                "by_kernel_class": survival_table(rows, "kernel_class", fraction),
                "by_flag": survival_table(rows, "flag", fraction), "tasks": entries}
    (out / "audit.json").write_text(json.dumps(document, indent=1, sort_keys=False, default=str) + "\n")
    (out / "audit_tasks.md").write_text(tasks_markdown(entries, f"{title}: per task"))
    written.update({"audit.json": out / "audit.json", "audit_tasks.md": out / "audit_tasks.md"})
    if coverage and coverage.get("per_task"):
        (out / "audit_baselines.md").write_text(baselines_markdown(coverage["per_task"], f"{title}: baselines"))
        written["audit_baselines.md"] = out / "audit_baselines.md"
    return dict(sorted(written.items()))
