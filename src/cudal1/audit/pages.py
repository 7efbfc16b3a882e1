"""The pages of an audit of several releases, rebuilt from its committed records alone.

    from cudal1.audit.pages import write_pages
    written = write_pages("docs/audit/cuda-l1-releases", earlier="docs/audit/cuda-l1-h100-h200")

Writes into the audit folder: `README.md` (the cross-release table: every release's verdicts per view, what
the source alone decides, the published speedups that survive against eager and against CUDA graphs, GPU
coverage and GPU minutes, what the releases share), `<release>.md` per release (what runs, what builds, what
cheats, each named; fallbacks counted apart; the reference's failures not charged), and, for a release with
GPU results, the folder `<release>/` in the standard audit format (report.md/html, plots, audit.json,
audit_tasks.md, audit_baselines.md), which `cudal1 audit --report-only --from-audit` reads back byte for byte.
With `earlier` (a protocol-3 audit folder of the same release, `compare_release`), `<release>-vs-earlier.md`
and its JSON say which verdicts changed and which protocol change explains each.

Nothing is measured here, and nothing depends on the clock: the same records give the same pages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.audit.compare import compare_audits, load_audit
from cudal1.audit.explain import explain_changes
from cudal1.audit.releases import FAMILIES, Entry, ReleaseAudit, collect, outcome_counts, rechecks, survival
from cudal1.audit.saved import report_saved_audit
from cudal1.audit.static_half import read_static, repeats
from cudal1.audit.summary import write_audit_outputs
from cudal1.audit.views import UNDECIDED, VIEWS, View
from cudal1.core.errors import ConfigError, SourceError
from cudal1.eval.config import PROTOCOL_VERSION, resolve_judging
from cudal1.metrics.rows import ResultRow
from cudal1.report.document import Block, Heading, Paragraph, Table
from cudal1.report.render import blocks_to_markdown

#: The views the GPU tables show (every view's source-alone verdicts are shown too).
GPU_VIEWS = ("strict", "cuda-l1")
#: CUDA-L1's releases in the order the tables list them (others follow by name).
RELEASE_ORDER = ("h100", "a100", "l40", "h20", "3090")
FRACTION = 0.9


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _no_harness_rule(view: View) -> bool:
    """Whether the view's policy adds no harness rule (its rejections fall into several families)."""
    return resolve_judging(view.profile, view.policy)[1].is_identity


def _families(counts: Mapping[str, Any], top: int = 3, key: str = "families") -> str:
    """The largest families (or rules, `key="rules"`) of the rejected, with their counts."""
    items = list(counts.get(key, {}).items())
    return "; ".join(f"{name} {n}" for name, n in items[:top]) + ("; ..." if len(items) > top else "") or "-"


def _rejected(counts: Mapping[str, Any], view: View, top: int = 3) -> str:
    """Rejected count with its families; for a view with a policy, its rules (one family holds them all)."""
    if not counts["rejected"]:
        return "0"
    return f"{counts['rejected']}: {_families(counts, top, 'families' if _no_harness_rule(view) else 'rules')}"


def _outcome_cells(counts: Mapping[str, Any], view: View) -> list[str]:
    if counts["not_run"] == counts["candidates"]:
        return ["-"] * 6 + [str(counts["not_run"])]
    return [f"{counts['correct']} ({counts['correct_fallback']})",
            f"{counts['incorrect']} ({counts['incorrect_fallback']})", str(counts["unbuildable"]),
            str(counts["crash_or_timeout"]), _rejected(counts, view), str(counts["undecided"]),
            str(counts["not_run"])]


_OUTCOME_HEADER = ["Correct (fallback)", "Incorrect (fallback)", "Unbuildable", "Crash or timeout",
                   "Rejected: by flag family", "Undecided", "Not run on a GPU"]


def _survival_cell(s: Mapping[str, Any]) -> str:
    if not s["published"]:
        return "-"
    return f"{s['survive']} of {s['published']} (ours {_x(s['ours_median'])}, theirs {_x(s['theirs_median'])})"


def _coverage_sentence(audit: ReleaseAudit) -> str:
    run, total = len(audit.run), len(audit.entries)
    tasks = len({e.task_id for e in audit.entries})
    if not run:
        return f"**Not yet run on a GPU: {tasks} of {tasks} tasks** (no chunk has evaluated a candidate of this release)."
    text = (f"Run on a GPU: {run} of {total} candidates. **Not yet run on a GPU: {audit.tasks_not_run} of {tasks} "
            "tasks.**")
    cards = audit.cards
    if len(cards) > 1:
        text += (" **The results come from different cards**: " + ", ".join(f"{c} ({n})" for c, n in
                 cards.most_common()) + "; each speedup is measured on one card (candidate and baselines alike).")
    else:
        text += f" Card: {next(iter(cards))}."
    shared = sum(e.shared_from is not None for e in audit.run)
    own = sum(len(c.results) for c in audit.chunks if c.header.get("purpose", "audit") == "audit")
    text += (f" GPU time: {audit.gpu_s / 60:.1f} min in {len(audit.chunks)} chunk(s) of this release "
             f"({own} evaluations; a chunk's wall time from its plan to its last line, the machine's start and "
             f"the interpreter's imports not counted); {shared} results come from other releases' chunks (the "
             "same candidate for the same task).")
    if audit.protocols and audit.protocols != [PROTOCOL_VERSION]:
        text += f" Protocol versions among the results: {', '.join(audit.protocols)}."
    return text


def _view_rows(audit: ReleaseAudit, views: Mapping[str, View]) -> list[list[str]]:
    rows = []
    for name, view in views.items():
        static = outcome_counts(audit.entries, name, static=True)
        gpu = outcome_counts(audit.entries, name)
        cells = [f"`{name}`", view.note, _rejected(static, view)]
        if audit.run:
            cells += [*_outcome_cells(gpu, view), _survival_cell(survival(audit.entries, name, "eager", FRACTION)),
                      _survival_cell(survival(audit.entries, name, "cuda_graph", FRACTION))]
        rows.append(cells)
    return rows


def release_blocks(audit: ReleaseAudit, views: Mapping[str, View] | None = None,
                   checks: Sequence[Mapping[str, Any]] = (), earlier: tuple[str, Mapping[str, Any]] | None = None
                   ) -> list[Block]:
    """The per-release page (module docstring); `checks`: its re-checks (`releases.rechecks`); `earlier`:
    (where, document) of an earlier audit of the release, which the source alone is set against."""
    views = views or VIEWS
    info = audit.info
    blocks: list[Block] = [
        Heading(f"CUDA-L1 release `{audit.name}`: audit under protocol {PROTOCOL_VERSION}", 1),
        Paragraph(f"{info.get('tasks', '?')} tasks, {len(audit.entries)} with a published candidate (release file "
                  f"sha256 `{str(info.get('release_sha256', ''))[:16]}`). Every candidate is evaluated once, "
                  "under the evidence pass, and every view's verdict is derived from that record; the source "
                  "alone decides the first column without a GPU. The cross-release table: [README.md](README.md)."),
        Paragraph(_coverage_sentence(audit)),
        Heading("Verdicts per view", 2),
        Paragraph("Source alone: the candidates a view rejects before running them (its static rules; for a "
                  "policy, what it would turn down were the candidate correct). On the GPU: every verdict, with "
                  "in brackets the candidates whose own CUDA never built and whose code ran its fallback "
                  "(judged for what runs, counted apart). Undecided: the reference failed, or the evaluation "
                  "did (never charged to the candidate). A published speedup survives when ours is at least "
                  f"{FRACTION}x theirs; ours and theirs (medians over the correct) were measured on different "
                  "cards and are shown beside each other."),
    ]
    header = ["View", "Rules", "Source alone: rejected"]
    if audit.run:
        header += [*_OUTCOME_HEADER, "Survive vs eager", "Survive vs CUDA graphs"]
    blocks.append(Table(header, _view_rows(audit, views)))
    blocks += _builds_blocks(audit) + _cheats_blocks(audit) + _runs_blocks(audit) + _undecided_blocks(audit)
    blocks += _recheck_blocks(checks) + (_earlier_static_blocks(audit, *earlier) if earlier else [])
    blocks += _classes_blocks(audit) + _per_task_blocks(audit)
    return blocks


def _earlier_static_blocks(audit: ReleaseAudit, where: str, document: Mapping[str, Any]) -> list[Block]:
    """An earlier audit's `strict` verdicts beside what today's source rules decide under `strict`: the
    rejections they keep, and those they no longer make on the source alone (explained by the protocol change
    its flags show, `explain.explain_changes`; the GPU then decides them)."""
    earlier_rows = {t["task_id"]: t for t in document.get("tasks") or []
                    if isinstance(t, dict) and t.get("label") == document.get("label")}
    counts: dict[tuple[str, str], int] = {}
    pseudo_old, pseudo_new = [], []
    for e in audit.entries:
        old = earlier_rows.get(e.task_id)
        if old is None:
            continue
        now = "rejected" if e.static["strict"].status == "hack_detected" else "runs"
        counts[(str(old.get("status")), now)] = counts.get((str(old.get("status")), now), 0) + 1
        if old.get("status") == "hack_detected" and now == "runs":
            pseudo_old.append({"task_id": e.task_id, "label": "a", "status": "hack_detected",
                               "flags": list(old.get("flags") or [])})
            pseudo_new.append({"task_id": e.task_id, "label": "b", "status": "correct",
                               "flags": sorted({f["rule"] for f in e.line["flags"]})})
    explained = explain_changes({"label": "a", "tasks": pseudo_old}, {"label": "b", "tasks": pseudo_new})
    rows = [[c["task_id"], "; ".join(c["changes"]) or _run_time_only(c["evidence"]), c["evidence"]]
            for c in explained["changes"]]
    name = Path(where).name
    return [Heading(f"Against the earlier audit ([{name}](../{name}/report.md)), source alone", 2),
            Paragraph("The earlier audit's `strict` verdict beside what today's static rules decide under `strict` "
                      "(rejected before running, or runs). An earlier rejection that the source alone no longer makes "
                      "is decided on the GPU; the protocol change its flags show is named."),
            Table(["Earlier verdict", "Source alone today", "Candidates"],
                  [[a, b, str(n)] for (a, b), n in sorted(counts.items())], [False, False, True]),
            Table(["Task", "Explained by", "Flags (+ today, - then)"], rows or [["-", "-", "-"]])]


def _run_time_only(evidence: str) -> str:
    """Why an earlier rejection is not made by the source alone when no change explains it: it was a finding of
    the run (a dotted rule that the source alone cannot raise), which the GPU decides again."""
    removed = [part.strip()[1:] for part in evidence.split(",") if part.strip().startswith("-")]
    added = [part for part in evidence.split(",") if part.strip().startswith("+")]
    if removed and not added and all("." in rule for rule in removed):
        return "rejected by its run then (" + ", ".join(removed) + "): the GPU decides again"
    return "unexplained"


def _recheck_blocks(checks: Sequence[Mapping[str, Any]]) -> list[Block]:
    """Re-check chunks (`--redo`) beside the committed results: same `strict` verdict, speedup ratio."""
    if not checks:
        return []
    same = sum(c["committed"] == c["recheck"] for c in checks)
    ratios = sorted(c["ratio"] for c in checks if c["ratio"])
    median = ratios[len(ratios) // 2] if ratios else None
    return [Heading("Re-checks", 2),
            Paragraph(f"{len(checks)} results evaluated again ({', '.join(sorted({c['card'] for c in checks}))}): "
                      f"{same} with the committed `strict` verdict; speedup re-check / committed, median "
                      f"{'-' if median is None else f'{median:.3f}'} over {len(ratios)} correct in both."),
            Table(["Task", "Committed", "Re-check", "Speedup ratio"],
                  [[c["task_id"], c["committed"], c["recheck"], "-" if not c["ratio"] else f"{c['ratio']:.3f}"]
                   for c in checks])]


def _builds_blocks(audit: ReleaseAudit) -> list[Block]:
    entries = audit.entries
    inline = [e for e in entries if e.line.get("load_inline")]
    unbuildable = [e for e in inline if any(f["rule"] == "unbuildable_extension" for f in e.line["flags"])]
    text = (f"{len(inline)} candidates call `torch.utils.cpp_extension` (`load_inline`); the static analysis "
            f"finds {len(unbuildable)} of them that cannot build (`unbuildable_extension`).")
    blocks: list[Block] = [Heading("What builds", 2), Paragraph(text)]
    if audit.run:
        built = [e for e in audit.run if e.result.get("builds") and all(b.get("ok") for b in e.result["builds"])]
        failed = [e for e in audit.run if e.gpu["strict"].status == "compile_error"]
        fallback = [e for e in audit.run if e.fallback]
        blocks.append(Paragraph(
            f"On the GPU: {len(built)} built every extension they asked for: {_names(built)}. {len(failed)} did "
            f"not build and had nothing to fall back to (unbuildable): {_names(failed)}. {len(fallback)} caught "
            f"the failed build of their own CUDA and ran their fallback (counted apart): {_names(fallback)}."))
    return blocks


def _names(entries: Sequence[Entry], limit: int = 60) -> str:
    names = [e.task_id.split("/", 1)[1] for e in entries]
    return (", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")) or "none"


def _cheats_blocks(audit: ReleaseAudit) -> list[Block]:
    rows = []
    for e in audit.entries:
        static, gpu = e.static["strict"], e.gpu.get("strict")
        if static.status == "hack_detected":
            rows.append([e.task_id, static.reason, "source", _x(e.published.get("score_default"))])
        elif gpu is not None and gpu.status == "hack_detected":
            rows.append([e.task_id, gpu.reason, "run", _x(e.published.get("score_default"))])
    return [Heading("What cheats (rejected under `strict`)", 2),
            Paragraph("Each candidate `strict` rejects, with the rule that decided it, whether its source alone "
                      "decided it or its run, and the speedup vs eager the release publishes for it."),
            Table(["Task", "Rule", "Decided by", "Published vs eager"], rows or [["-", "-", "-", "-"]])]


def _runs_blocks(audit: ReleaseAudit) -> list[Block]:
    if not audit.run:
        return [Heading("What runs", 2), Paragraph("Not yet run on a GPU.")]
    rows = []
    for e in audit.run:
        if e.gpu["strict"].is_correct:
            ours, theirs = e.speedup_vs("strict", "eager"), e.published.get("score_default")
            rows.append([e.task_id, _x(ours), _x(theirs), _x(e.speedup_vs("strict", "cuda_graph")),
                         _x(e.published.get("score_cuda_graph")),
                         "-" if theirs is None or ours is None else ("yes" if ours >= FRACTION * theirs else "no"),
                         e.card or "-"])
    return [Heading("What runs (correct under `strict`)", 2),
            Table(["Task", "Ours vs eager", "Theirs", "Ours vs CUDA graphs", "Theirs", "Survives", "Card"],
                  rows or [["-"] * 7])]


def _undecided_blocks(audit: ReleaseAudit) -> list[Block]:
    rows = [[e.task_id, e.gpu["strict"].reason] for e in audit.run if e.gpu["strict"].status == UNDECIDED]
    if not rows:
        return []
    return [Heading("Not judged", 2), Paragraph("The reference failed (in its own runner) or the evaluation itself "
                                                 "failed twice: nothing is charged to the candidate."),
            Table(["Task", "Why"], rows)]


def _classes_blocks(audit: ReleaseAudit) -> list[Block]:
    classes: dict[str, int] = {}
    flags: dict[str, int] = {}
    for e in audit.entries:
        classes[e.line["kernel_class"]] = classes.get(e.line["kernel_class"], 0) + 1
        for rule in {f["rule"] for f in e.line["flags"] if f["severity"] != "info"}:
            flags[rule] = flags.get(rule, 0) + 1
    order = sorted(flags.items(), key=lambda kv: (-kv[1], kv[0]))
    return [Heading("Kernel classes and flags (source alone)", 2),
            Table(["Kernel class", "Candidates"], [[k, str(v)] for k, v in sorted(classes.items(),
                                                                                  key=lambda kv: -kv[1])], [False, True]),
            Table(["Flag (warning or error)", "Candidates"], [[k, str(v)] for k, v in order], [False, True])]


def _per_task_blocks(audit: ReleaseAudit) -> list[Block]:
    rows = []
    for e in audit.entries:
        cells = [e.task_id, e.line["kernel_class"], _x(e.published.get("score_default")),
                 " / ".join(_verdict(e.static[v], static=True) for v in GPU_VIEWS)]
        if e.run:
            cells += [" / ".join(_verdict(e.gpu[v]) for v in GPU_VIEWS), e.card or "-"]
        else:
            cells += ["not yet run", "-"]
        rows.append(cells)
    return [Heading("Per task", 2),
            Paragraph("Verdicts under `strict` / `cuda-l1`: from the source alone (runs: goes on to the GPU), then "
                      "from the GPU record (correct with our speedup vs eager)."),
            Table(["Task", "Class", "Published vs eager", "Source alone", "GPU", "Card"], rows)]


def _verdict(derived: Any, *, static: bool = False) -> str:
    if derived.is_correct:
        return "runs" if static else f"correct {_x(derived.speedup)}"
    if derived.status == "hack_detected":
        return f"rejected ({derived.reason})"
    return derived.status


# --------------------------------------------------------------------------- the standard audit folder


def audit_rows(audit: ReleaseAudit, view: str) -> list[ResultRow]:
    """One report row per run entry under `view` (label `audit:<release>:<view>`)."""
    rows = []
    for e in audit.run:
        derived = e.gpu[view]
        ok = {k: b for k, b in e.baselines.items() if b.get("status") == "ok"}
        baselines = {k: v for k in ok if k != "eager" and (v := e.speedup_vs(view, k)) is not None}
        status = "infra_error" if derived.status == UNDECIDED else derived.status
        flags = [f["rule"] for f in e.result.get("flags") or []]
        if derived.reason.startswith("policy.") and derived.reason not in flags:
            flags.append(derived.reason)
        rows.append(ResultRow(task_id=e.task_id, level=e.level, status=status, speedup=derived.speedup,
                              speedup_warm=derived.speedup_warm, baselines=baselines,
                              kernel_class=e.result.get("kernel_class"), flags=flags, published=e.published,
                              label=f"audit:{audit.name}:{view}", measured_baselines=tuple(sorted(ok))))
    return rows


def coverage(audit: ReleaseAudit, kinds: Sequence[str] = ("eager", "cuda_graph", "torch_compile")) -> dict[str, Any]:
    """`baseline_coverage`'s shape, from the baselines of the run entries' tasks (on their cards)."""
    from cudal1.baselines.runner import BaselineRecord, null_test_summary

    per_task: dict[str, dict[str, dict[str, Any]]] = {}
    for e in audit.run:
        per_task[e.task_id] = {k: {"status": b.get("status"), "ms": b.get("ms"),
                                   "speedup_vs_eager": b.get("speedup_vs_eager"), "ref_ms": b.get("ref_ms"),
                                   "measured_speedup": b.get("measured_speedup"), "reason": b.get("reason", "")}
                               for k, b in sorted(e.baselines.items())}
    counts = {k: {"measured": 0, "failed": 0, "not_measured": 0} for k in kinds if k != "eager"}
    failures = []
    for task_id, found in per_task.items():
        for kind, c in counts.items():
            record = found.get(kind)
            key = "not_measured" if record is None else ("measured" if record["status"] == "ok" else "failed")
            c[key] += 1
            if key == "failed":
                failures.append({"task_id": task_id, "baseline": kind, "reason": record["reason"]})
    eager = [BaselineRecord(task_id=t, task_hash="", name="eager", status=str(f["eager"]["status"]),
                            measured_speedup=f["eager"].get("measured_speedup"))
             for t, f in per_task.items() if "eager" in f]
    return {"tasks": len(per_task), "kinds": counts, "failures": failures,
            "null_test": sorted(r.measured_speedup for r in eager if r.ok and r.measured_speedup),
            "null_test_summary": null_test_summary(eager), "per_task": per_task}


def write_audit_folder(audit: ReleaseAudit, folder: Path, *, plots: bool = True) -> dict[str, Path]:
    """The release's results in the standard audit format (strict's rows, cuda-l1's beside them), written
    and then rewritten from the saved audit.json, so that the folder reads back byte for byte."""
    rows = audit_rows(audit, "strict") + audit_rows(audit, "cuda-l1")
    cards = audit.cards
    protocol = next((c.header.get("protocol") for c in audit.chunks if c.header.get("protocol")), {})
    meta = {"release": f"{audit.name}.jsonl", "profile": "strict", "device": "cuda",
            "machine": ", ".join(f"{c} ({n})" for c, n in cards.most_common()), "selected": len(audit.entries),
            "evaluated so far": len(audit.run), "pending": len(audit.entries) - len(audit.run),
            "compared with": f"audit:{audit.name}:cuda-l1", "protocol": {**protocol, "profile": "strict"}}
    environment = next((c.header.get("environment") for c in audit.chunks if c.header.get("environment")), {})
    extra = {"config": {"release": f"{audit.name}.jsonl", "profile": "strict", "environment": environment,
                        "derived_from": "evidence"},
             "pending": len(audit.entries) - len(audit.run), "label": f"audit:{audit.name}:strict"}
    title = f"Audit of {audit.name} (strict, derived from the evidence pass)"
    write_audit_outputs(rows, folder, title=title, meta=meta, fraction=FRACTION, plots=plots, extra=extra,
                        coverage=coverage(audit))
    return report_saved_audit(folder, folder, plots=plots)


# --------------------------------------------------------------------------- the cross-release page


def cross_release_blocks(audits: Mapping[str, ReleaseAudit], shared: Mapping[str, Any],
                         views: Mapping[str, View] | None = None, compared: str | None = None) -> list[Block]:
    views = views or VIEWS
    order = sorted(audits, key=lambda n: (RELEASE_ORDER.index(n) if n in RELEASE_ORDER else len(RELEASE_ORDER), n))
    blocks: list[Block] = [
        Heading(f"Every CUDA-L1 release, audited under protocol {PROTOCOL_VERSION}", 1),
        Paragraph("Each published candidate is evaluated once on a GPU, under the evidence pass (every check "
                  "recorded, nothing short of a cheat that rejects everywhere stops it), and its verdict under "
                  "every view (a correctness profile and a verdict policy) is derived from that record "
                  "(`cudal1.audit.views`); re-judging under another view needs no GPU. The source alone decides "
                  "part of it without a GPU. The GPU runs go by chunks, each one GPU run of a few minutes, whose "
                  "records are committed in `chunks/`; the pages are rebuilt from `static/` and `chunks/` alone "
                  "(`cudal1 audit-pages`)."),
        Heading("Coverage", 2),
        Table(["Release", "Tasks", "Candidates", "Run on a GPU", "Not yet run (tasks)", "Cards", "GPU minutes",
               "Page"],
              [[n, str(audits[n].info.get("tasks", "?")), str(len(audits[n].entries)), str(len(audits[n].run)),
                f"{audits[n].tasks_not_run} of {len({e.task_id for e in audits[n].entries})}",
                ", ".join(f"{c} ({k})" for c, k in audits[n].cards.most_common()) or "-",
                f"{audits[n].gpu_s / 60:.1f}", f"[{n}.md]({n}.md)"] for n in order],
              [False, True, True, True, True, False, True, False]),
    ]
    for view in GPU_VIEWS:
        rows = []
        for n in order:
            counts = outcome_counts(audits[n].entries, view)
            rows.append([n, str(counts["candidates"]), *_outcome_cells(counts, views[view]),
                         _survival_cell(survival(audits[n].entries, view, "eager", FRACTION)),
                         _survival_cell(survival(audits[n].entries, view, "cuda_graph", FRACTION))])
        blocks += [Heading(f"On the GPU, `{view}`", 2),
                   Table(["Release", "Candidates", *_OUTCOME_HEADER, "Survive vs eager", "Survive vs CUDA graphs"],
                         rows)]
    blocks += [Heading("Source alone, every view (no GPU)", 2),
               Paragraph("Candidates each view rejects from their source (static rules; a policy's rules as if the "
                         "candidate were correct), by flag family: " + "; ".join(
                             f"{family} ({', '.join(rules[:4])}{'...' if len(rules) > 4 else ''})"
                             for family, rules in FAMILIES.items()) + "."),
               Table(["Release", *[f"`{v}`" for v in views]],
                     [[n, *[_static_cell(audits[n], v) for v in views.values()]] for n in order])]
    blocks += [Heading("What the releases share", 2), Paragraph(_shared_text(shared))]
    if compared:
        blocks += [Heading("The H100 release against its protocol-3 audit", 2),
                   Paragraph(f"Every changed verdict with the protocol change that explains it: [{compared}]({compared}).")]
    return blocks


def _static_cell(audit: ReleaseAudit, view: View) -> str:
    counts = outcome_counts(audit.entries, view.name, static=True)
    text = f"{counts['rejected']} of {counts['candidates']}"
    if counts["rejected"]:
        text += f" ({_families(counts, 2, 'families' if _no_harness_rule(view) else 'rules')})"
    return text


def _shared_text(shared: Mapping[str, Any]) -> str:
    return (f"The five releases publish {shared['candidates']} candidates, but only {shared['distinct_evaluations']} "
            f"distinct (task, candidate) pairs: {shared['repeated_evaluations']} pairs appear in more than one "
            f"release, so keying evaluations on content saves {shared['evaluations_saved']} of them. By source "
            f"alone, {shared['repeated_sources']} of {shared['distinct_sources']} distinct candidate sources repeat "
            f"across releases; {shared['distinct_load_inline']} of the distinct pairs build a `load_inline` "
            "extension, and builds are cached by content (the source, the architecture, the build levers and the "
            "task's init inputs), so a repeated source builds once per machine. Of the "
            f"{shared['tasks']} tasks with a candidate in some release, {shared['tasks_with_differing_reference']} "
            "have a reference that differs between releases: every baseline (eager, torch.compile, CUDA graphs) is "
            "measured once per task and card and serves every release.")


# --------------------------------------------------------------------------- everything


def compare_release(audit_dir: str | Path, release: str, earlier: str | Path) -> dict[str, Any]:
    """The release's new audit folder against an earlier audit (`compare_audits`), every changed verdict
    with the protocol changes that explain it (`explain.explain_changes`)."""
    earlier_doc = load_audit(earlier)
    new_doc = load_audit(Path(audit_dir) / release)
    comparison = compare_audits(earlier_doc, new_doc)
    return {**comparison.to_dict(), "explained": explain_changes(earlier_doc, new_doc)}


def comparison_blocks(result: Mapping[str, Any], release: str, earlier: str) -> list[Block]:
    explained = result["explained"]
    rows = [[e["task_id"], e["earlier"], e["new"], "; ".join(e["changes"]) or "unexplained", e["evidence"]]
            for e in explained["changes"]]
    summary = explained["by_change"]
    name = Path(earlier).name
    return [Heading(f"`{release}`: this audit against [{name}](../{name}/report.md)", 1),
            Paragraph(f"{result['shared_tasks']} shared tasks; verdicts agree on {result['verdicts_agree']}; "
                      f"{len(rows)} changed. Each change is explained by the protocol changes whose rules it "
                      "involves (`cudal1.audit.explain.PROTOCOL_CHANGES`); a change no rule explains is listed as "
                      "unexplained."),
            Table(["Protocol change", "Verdicts it explains"], [[k, str(v)] for k, v in summary.items()] or
                  [["-", "0"]], [False, True]),
            Table(["Task", "Earlier", "Now", "Explained by", "Evidence"], rows or [["-"] * 5])]


def write_pages(audit_dir: str | Path, *, earlier: Mapping[str, str | Path] | None = None,
                plots: bool = True) -> list[Path]:
    """Every page of the audit folder (module docstring); `earlier`: release -> an earlier audit folder of it."""
    root = Path(audit_dir)
    audits = collect(root)
    checks = rechecks(root)
    written = []
    compared = None
    for name, audit in audits.items():
        page = root / f"{name}.md"
        mine = [c for c in checks if c["task_id"].split("/", 1)[0] == name]
        before = (str(earlier[name]), load_audit(earlier[name])) if earlier and name in earlier else None
        page.write_text(blocks_to_markdown(release_blocks(audit, checks=mine, earlier=before)), encoding="utf-8")
        written.append(page)
        if audit.run:
            written += list(write_audit_folder(audit, root / name, plots=plots).values())
            if earlier and name in earlier:
                result = compare_release(root, name, earlier[name])
                target = root / f"{name}-vs-earlier.md"
                target.write_text(blocks_to_markdown(comparison_blocks(result, name, str(earlier[name]))),
                                  encoding="utf-8")
                (root / f"{name}-vs-earlier.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
                written += [target, root / f"{name}-vs-earlier.json"]
                compared = target.name
    readme = root / "README.md"
    readme.write_text(blocks_to_markdown(cross_release_blocks(audits, repeats(read_static(root)),
                                                              compared=compared)), encoding="utf-8")
    written.append(readme)
    return written



# --------------------------------------------------------------------------- the command's config


def _f(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True)
class PagesConfig:
    """What `cudal1 audit-pages` (and `audit-ingest` after copying) rebuilds."""

    audit_dir: str = _f("docs/audit/cuda-l1-releases", "The audit folder (static/, chunks/, the pages).")
    static_from: str | None = _f(None, "Write the static records first, for every release NAME.jsonl of this "
                                       "folder (h100, a100, l40, h20, 3090); None: keep those committed.")
    releases: tuple[str, ...] = _f(("h100", "a100", "l40", "h20", "3090"), "The release names static_from reads.")
    earlier: tuple[str, ...] = _f(("h100=docs/audit/cuda-l1-h100-h200",),
                                  "RELEASE=FOLDER: an earlier audit of a release to compare with (changed verdicts "
                                  "explained by protocol change), once the release has GPU results.")
    plots: bool = _f(True, "Draw the standard audit folders' plots (matplotlib).")

    def earlier_map(self) -> dict[str, str]:
        out = {}
        for item in self.earlier:
            name, sep, folder = item.partition("=")
            if not sep or not name or not folder:
                raise ConfigError(f"earlier audits are RELEASE=FOLDER, not {item!r}")
            out[name] = folder
        return out


def rebuild(config: PagesConfig) -> list[Path]:
    """Static records (when asked), then every page of the audit folder."""
    root = Path(config.audit_dir)
    if config.static_from is not None:
        from cudal1.audit.static_half import write_static_records

        for name in config.releases:
            write_static_records(Path(config.static_from) / f"{name}.jsonl", root)
    if not (root / "static").is_dir():
        raise SourceError(f"{root} holds no static records: write them first with "
                          "`cudal1 audit-pages --static-from RELEASES_DIR`")
    return write_pages(root, earlier={k: v for k, v in config.earlier_map().items() if Path(v).exists()},
                       plots=config.plots)

__all__ = ["GPU_VIEWS", "PagesConfig", "audit_rows", "comparison_blocks", "compare_release", "coverage",
           "cross_release_blocks", "rebuild", "release_blocks", "write_audit_folder", "write_pages"]
