"""Audit a published release on this GPU within a time budget: a per-level sample first, then the rest.

    python scripts/audit_release.py OUT_DIR --release ../shared/data/cuda-l1/h100.jsonl --time-budget-s 480

Every release, one chunk per GPU run (`cudal1.audit.chunks`; the records committed under
docs/audit/cuda-l1-releases/chunks say what is done, so any later run continues where the last stopped):

    python scripts/audit_release.py chunk --release h100 --out OUT --budget-s 400   # on the GPU: next chunk
    python scripts/audit_release.py ingest OUT                                      # here: records in, pages
    python scripts/audit_release.py pages --static-from RELEASES_DIR               # static half and pages

Phases, each resuming from the store: (1) the candidates of a per-level sample, (2) every candidate, (3) the
`--all-baselines` (default: the CUDA graph) for every task, (4) the `--baselines` (default: all kinds) for
the sample's tasks. Writes into OUT_DIR: `store.sqlite` (unless --store names another; carry it into the
next call to resume), `report/` (report.md, report.html, plots, audit.json, audit_tasks.md,
audit_baselines.md) and `summary.json` (per phase: candidates evaluated and reused; baselines measured,
reused and left), and prints a short table last. The report covers every task of the release evaluated so
far, whichever phases ran. A release larger than one call's budget is finished by repeating the same command
with the store carried over.

Several GPUs: one process per GPU, each with its own `--chunk I/N` and `CUDA_VISIBLE_DEVICES`, all on one
`--store` (SQLite, safe for concurrent writers); then `--report-only` writes the report of the whole store.

Without the store (`--report-only` and no store file at `--store` or OUT_DIR/store.sqlite), the report is
rewritten from a saved audit alone: `--from-audit` (an audit.json or its folder, e.g. a committed one), else
OUT_DIR/report/audit.json; no release file is needed then. Bad input is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--release", default=None, help="JSONL release (CUDA-L1 schema); required unless "
                                                  "--report-only reports a saved audit.")
    p.add_argument("--time-budget-s", type=float, default=480.0, help="Stop starting work after this.")
    p.add_argument("--store", type=Path, default=None, help="Results store (default OUT_DIR/store.sqlite).")
    p.add_argument("--profile", default="strict", help="strict or cuda-l1.")
    p.add_argument("--sample-per-level", type=int, default=3, help="Sample size per level of phase 1.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baselines", default="all", help="Baselines for the sample's tasks ('' none).")
    p.add_argument("--all-baselines", default="cuda_graph", help="Baselines for every task ('' none).")
    p.add_argument("--chunk", default=None, help="Only chunk I/N of each phase's selection (one GPU each).")
    p.add_argument("--report-only", action="store_true",
                   help="Evaluate nothing; report what the store holds (no GPU needed: the results of the GPU "
                        "with the most results under this profile, or of --gpu).")
    p.add_argument("--gpu", default=None, help="With --report-only: report the results measured on this GPU name.")
    p.add_argument("--from-audit", type=Path, default=None,
                   help="With --report-only: rewrite the report from this saved audit.json (or its folder), no store.")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--no-plots", action="store_true")
    return p.parse_args(argv)


def asked_baselines(args: argparse.Namespace, selected: list, kinds: tuple[str, ...],
                    all_kinds: tuple[str, ...]) -> dict[str, set[str]]:
    """Baseline kind -> the ids of the tasks this script asks it for: `--all-baselines` for every task of
    the selection, `--baselines` for the sample's tasks (phase 4)."""
    from cudal1.audit.select import select_items
    from cudal1.tasks import load_release

    every = {task.id for task, _ in selected}
    sample = {task.id for task, _ in select_items(load_release(Path(args.release)),
                                                  sample_per_level=args.sample_per_level, seed=args.seed)}
    asked: dict[str, set[str]] = {}
    for kind in kinds:
        asked.setdefault(kind, set()).update(sample & every)
    for kind in all_kinds:
        asked.setdefault(kind, set()).update(every)
    return asked


def saved_audit_source(args: argparse.Namespace) -> Path | None:
    """The saved audit.json that `--report-only` rewrites the report from, or None to report from the store."""
    from cudal1.audit.saved import saved_audit_path
    from cudal1.core.errors import SourceError

    store = args.store or args.out_dir / "store.sqlite"
    if args.from_audit is not None:
        if args.store is not None:
            raise SourceError("give --store or --from-audit, not both")
        return saved_audit_path(args.from_audit)
    if store.is_file():
        return None
    saved = args.out_dir / "report" / "audit.json"
    if saved.is_file():
        return saved
    raise SourceError(f"no results store at {store} and no saved report at {saved}: give --store PATH, or "
                      "--from-audit AUDIT.json (a saved audit report)")


def main(argv: list[str] | None = None) -> int:
    """Run the phases (or only the report), or a chunk command; print bad input as one line and return 2."""
    from cudal1.core.errors import Cudal1Error

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in CHUNK_COMMANDS:
            return chunk_main(argv)
        return _main(_parse(argv))
    except Cudal1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


CHUNK_COMMANDS = ("chunk", "ingest", "pages")


def _parse_chunk_commands(argv: list[str]) -> argparse.Namespace:
    from cudal1.audit.chunks import DEFAULT_AUDIT_DIR, DEFAULT_DATA_DIR

    p = argparse.ArgumentParser(prog="audit_release.py", description="An audit of every release, by chunks.")
    sub = p.add_subparsers(dest="command", required=True)
    chunk = sub.add_parser("chunk", help="On the GPU: the next chunk of a release within --budget-s.")
    chunk.add_argument("--release", required=True, help="h100, a100, l40, h20, 3090 (in --data-dir) or a path.")
    chunk.add_argument("--out", type=Path, required=True, help="Folder the chunk record goes to.")
    chunk.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    chunk.add_argument("--budget-s", type=float, default=400.0)
    chunk.add_argument("--baselines", default="cuda_graph,eager,torch_compile", help="'' for none.")
    chunk.add_argument("--device", default="cuda")
    chunk.add_argument("--max-items", type=int, default=None)
    chunk.add_argument("--task", action="append", default=[], help="Only this task id (repeatable).")
    chunk.add_argument("--redo", action="store_true", help="Re-check: evaluate even when done.")
    chunk.add_argument("--commit", default=None, help="The code's commit, when this folder is no git checkout.")
    chunk.add_argument("--dry-run", action="store_true", help="Print the plan; run and write nothing.")
    ingest = sub.add_parser("ingest", help="Copy returned chunk records in and rebuild the pages.")
    ingest.add_argument("records", nargs="+", type=Path)
    pages = sub.add_parser("pages", help="Rebuild the pages (and the static records with --static-from).")
    pages.add_argument("--static-from", default=None, help="Folder of the releases NAME.jsonl.")
    for command in (chunk, ingest, pages):
        command.add_argument("--audit-dir", default=DEFAULT_AUDIT_DIR)
    for command in (ingest, pages):
        command.add_argument("--earlier", action="append", default=None, help="RELEASE=FOLDER (repeatable).")
        command.add_argument("--no-plots", action="store_true")
    return p.parse_args(argv)


def chunk_main(argv: list[str]) -> int:
    """`chunk`, `ingest` or `pages` (module docstring)."""
    from cudal1.audit.chunks import ChunkConfig, describe_plan, ingest_chunks, plan_next, run_chunk
    from cudal1.audit.pages import PagesConfig, rebuild
    from cudal1.baselines import parse_kinds

    args = _parse_chunk_commands(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "chunk":
        config = ChunkConfig(release=args.release, out_dir=str(args.out), audit_dir=args.audit_dir,
                             data_dir=args.data_dir, budget_s=args.budget_s, device=args.device,
                             baselines=tuple(parse_kinds(args.baselines)) if args.baselines else (),
                             max_items=args.max_items, tasks=tuple(args.task), redo=args.redo, commit=args.commit)
        if args.dry_run:
            print(describe_plan(plan_next(config)))
            return 0
        outcome = run_chunk(config)
        print(f"{outcome.path}: {outcome.evaluated} of {len(outcome.plan.items)} planned evaluations, "
              f"{outcome.baselines} baselines, {outcome.elapsed_s:.0f} s (estimated {outcome.plan.estimate_s:.0f} s); "
              f"pending before: {outcome.plan.pending}; left: {len(outcome.left)}")
        return 0
    defaults = PagesConfig()
    pages = PagesConfig(audit_dir=args.audit_dir, plots=not args.no_plots,
                        earlier=tuple(args.earlier) if args.earlier is not None else defaults.earlier,
                        static_from=getattr(args, "static_from", None))
    added = ingest_chunks(args.records, args.audit_dir) if args.command == "ingest" else []
    written = rebuild(pages)
    print(f"{len(added)} new chunk record(s); {len(written)} files written under {args.audit_dir}")
    return 0


def _main(args: argparse.Namespace) -> int:
    if args.gpu and not args.report_only:
        print("--gpu chooses whose results a report shows: use it with --report-only", file=sys.stderr)
        return 2
    if args.from_audit is not None and not args.report_only:
        print("--from-audit reports a saved audit: use it with --report-only", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    saved = saved_audit_source(args) if args.report_only else None
    if saved is not None:
        return report_saved(args, saved)
    if args.release is None:
        print("--release is required (unless --report-only reports a saved audit)", file=sys.stderr)
        return 2
    from cudal1.audit import AuditConfig, run_audit
    from cudal1.audit.run import collect_audit, measured_on, report_audit, report_only_config
    from cudal1.baselines import parse_kinds
    from cudal1.eval.config import EvalConfig
    from cudal1.store import ResultsStore

    started = time.monotonic()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    store = ResultsStore(args.store or args.out_dir / "store.sqlite")
    kinds = tuple(parse_kinds(args.baselines)) if args.baselines else ()
    all_kinds = tuple(parse_kinds(args.all_baselines)) if args.all_baselines else ()
    base = AuditConfig(release=args.release, profile=args.profile, batch_size=args.batch_size, chunk=args.chunk,
                       eval_config=EvalConfig(device=args.device, profile=args.profile))
    sample = dict(sample_per_level=args.sample_per_level, seed=args.seed)
    phases = [("sample", sample), ("all", {}), ("all_baselines", dict(baselines=all_kinds)),
              ("sample_baselines", dict(sample, baselines=kinds))]
    if args.report_only:
        base = report_only_config(base, store, args.gpu)
        print(measured_on(base.environment), flush=True)
        phases = []
    done = {}
    for name, extra in phases:
        left = args.time_budget_s - (time.monotonic() - started)
        if left <= 0:
            break
        measured: list[bool] = []  # per baseline record: was it cached already
        phase = run_audit(AuditConfig(**{**base.__dict__, **extra, "time_budget_s": left}), store,
                          on_baseline=lambda task, kind, record, seen=measured: seen.append(record.cached))
        done[name] = {"evaluated": phase.evaluated, "reused": phase.reused,
                      "left_for_later": phase.skipped_for_time, "pending": phase.pending}
        if "baselines" in extra:
            asked = len({task.hash for task, _ in phase.chunk}) * len(extra["baselines"])
            done[name].update(baselines_measured=measured.count(False), baselines_reused=measured.count(True),
                              baselines_left_for_later=asked - len(measured))
    if not done and not args.report_only:
        print("no time left to run anything", file=sys.stderr)
        return 1
    outcome = collect_audit(base, store)  # every task of the release, whichever phases ran
    written = report_audit(outcome, base, store, args.out_dir / "report", plots=not args.no_plots,
                           asked=asked_baselines(args, outcome.selected, kinds, all_kinds))
    finish(args, outcome.rows, base.survive_fraction, written, done, started, outcome.pending)
    return 0


def report_saved(args: argparse.Namespace, saved: Path) -> int:
    """`--report-only` without a store: OUT_DIR/report and summary.json rewritten from a saved audit."""
    from cudal1.audit.saved import load_saved_audit, report_saved_audit

    started = time.monotonic()
    audit = load_saved_audit(saved).check(release=args.release, profile=args.profile, gpu=args.gpu)
    print(f"reporting results measured on {audit.machine}, saved in {saved}", flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    written = report_saved_audit(audit, args.out_dir / "report", plots=not args.no_plots)
    finish(args, audit.own_rows, audit.fraction, written, {}, started, audit.pending)
    return 0


def finish(args: argparse.Namespace, rows: list, fraction: float, written: dict[str, Path], done: dict,
           started: float, pending: int) -> None:
    """Write summary.json and print the short table."""
    from cudal1.audit import profile_comparison, survival_table

    comparison = profile_comparison(rows, fraction)
    coverage = json.loads(written["audit.json"].read_text()).get("baseline_coverage", {})
    coverage.pop("per_task", None)  # in audit.json and audit_baselines.md
    summary = {"phases": done, "comparison": comparison, "elapsed_s": time.monotonic() - started,
               "baseline_coverage": coverage,
               "by_kernel_class": survival_table(rows, "kernel_class", fraction),
               "report": {k: str(v) for k, v in written.items()}}
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(f"{'label':34} {'rows':>5} {'correct':>7} {'survive':>11} {'mean':>6} {'median':>6} {'geomean':>7}")
    for line in comparison:
        def x(v):
            return "-" if v is None else f"{v:.2f}"
        print(f"{line['label']:34} {line['rows']:>5} {line['correct']:>7} "
              f"{line['survive']:>5}/{line['published']:<5} {x(line['mean']):>6} {x(line['median']):>6} "
              f"{x(line['geomean']):>7}")
    print(f"pending (not yet evaluated): {pending}; phases: {done}")
    print("baselines measured/failed/not measured: " + ", ".join(
        f"{kind} {c['measured']}/{c['failed']}/{c['not_measured']}" for kind, c in coverage.get("kinds", {}).items()))


if __name__ == "__main__":
    sys.exit(main())
