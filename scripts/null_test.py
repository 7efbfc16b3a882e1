#!/usr/bin/env python3
"""The protocol's null test: each task's reference timed as a candidate against itself.

Usage: python scripts/null_test.py OUT_DIR [--release PATH] [--per-level N] [--builtin] [--time-budget-s S]
                                   [--profile strict] [--repeat N] [--only ID,...]

Unbiased timing gives 1.00x with every figure of the clock cross-check inside its tolerance: the harness
costs both models the same. Prints, per task, the speedup, the stability and the cross-check's figures (the
reference's and the candidate's median time outside their reported spans, their paired difference and the
tolerance it is held to, the flushes after each model); then the median and spread over tasks. With
`--repeat N` every task is evaluated N times (in turn, N rounds), and the summary adds the median relative
difference between a task's rounds (the precision of a speedup of exactly 1.00x). Writes null_test.json
under OUT_DIR.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from cudal1.eval import EvalConfig, Status, evaluate_many  # noqa: E402
from cudal1.tasks import load_tasks  # noqa: E402

_MODEL = re.compile(r"\bclass\s+Model\s*\(")


def as_candidate(reference: str) -> str:
    """The reference module with its class renamed ModelNew (and `Model` kept as an alias for its own uses)."""
    return _MODEL.sub("class ModelNew(", reference, count=1) + "\n\nModel = ModelNew\n"


def pick_tasks(args: argparse.Namespace) -> list:
    tasks = []
    if args.builtin:
        tasks += list(load_tasks("builtin"))
    if args.release:
        by_level: dict = {}
        for task in load_tasks(f"jsonl:{args.release}"):
            by_level.setdefault(task.level, []).append(task)
        for level in sorted(by_level):
            tasks += by_level[level][: args.per_level]
    if args.only:
        tasks = [t for t in tasks if t.id in args.only.split(",")]
    return tasks


def round_precision(rows: list[dict]) -> dict:
    """Median and largest relative difference between the speedups of one task's rounds (max over min - 1)."""
    by_task: dict[str, list[float]] = {}
    for r in rows:
        if r["speedup"]:
            by_task.setdefault(r["task"], []).append(r["speedup"])
    diffs = sorted(max(v) / min(v) - 1 for v in by_task.values() if len(v) > 1)
    if not diffs:
        return {}
    return {"rounds_compared": len(diffs), "round_rel_diff_median": statistics.median(diffs),
            "round_rel_diff_max": diffs[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--release", type=Path)
    ap.add_argument("--per-level", type=int, default=4)
    ap.add_argument("--builtin", action="store_true")
    ap.add_argument("--profile", default="strict")
    ap.add_argument("--time-budget-s", type=float, default=400.0)
    ap.add_argument("--only", default="", help="Comma-separated task ids: only these of the selection.")
    ap.add_argument("--repeat", type=int, default=1, help="Rounds over the tasks (precision of the null).")
    ap.add_argument("--record-samples", action="store_true", help="Keep every timed call's figures in the rows.")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    per_round = pick_tasks(args)
    tasks = per_round * max(1, args.repeat)
    pairs = [(t, as_candidate(t.source)) for t in tasks]
    deadline = time.monotonic() + args.time_budget_s
    rows: list[dict] = []

    def report(i: int, result) -> None:
        task = tasks[i]
        clock = result.protocol.get("clock", {})
        rows.append({"task": task.id, "round": i // len(per_round), "status": result.status.value,
                     "speedup": result.speedup,
                     "stability": result.stability, "message": result.message[:200], **clock,
                     "ref_ms": result.ref_ms, "candidate_ms": result.candidate_ms,
                     "bucket_speedups": result.timing.bucket_speedups if result.timing else None,
                     "sandbox": result.protocol.get("sandbox_level"),
                     "gpu_memory_gib": result.protocol.get("gpu_memory_gib"),
                     "samples": result.protocol.get("samples")})
        print(f"{task.id:60s} {result.status.value:14s} {result.speedup or 0:7.3f}x  "
              f"gaps {clock.get('ref_gap_ms', 0) * 1e3:8.1f} / {clock.get('cand_gap_ms', 0) * 1e3:8.1f} us  "
              f"diff {clock.get('paired_diff_ms', 0) * 1e3:7.1f} us (tol {clock.get('tolerance_ms', 0) * 1e3:6.1f})  "
              f"flush {clock.get('flush_after_ref_ms', 0) * 1e3:6.1f} / {clock.get('flush_after_cand_ms', 0) * 1e3:6.1f} us"
              + (f"  {result.message[:80]}" if result.status is not Status.CORRECT else ""), flush=True)

    cfg = EvalConfig(profile=args.profile, record_samples=args.record_samples)
    evaluate_many(pairs, cfg, should_stop=lambda: time.monotonic() > deadline, on_result=report)
    speedups = sorted(r["speedup"] for r in rows if r["speedup"])
    summary = {"tasks": len(rows), "correct": len(speedups),
               "median": statistics.median(speedups) if speedups else None,
               "p5": speedups[max(0, int(0.05 * len(speedups)))] if speedups else None,
               "p95": speedups[min(len(speedups) - 1, int(0.95 * len(speedups)))] if speedups else None,
               "not_correct": [(r["task"], r["status"], r["message"]) for r in rows if r["status"] != "correct"]}
    summary.update(round_precision(rows))
    (args.out_dir / "null_test.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print("\n== null test ==")
    for k, v in summary.items():
        print(f"{k:12s} {v}")


if __name__ == "__main__":
    main()
