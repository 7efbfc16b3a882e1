#!/usr/bin/env python3
"""The GPU tests, then the evaluator's benchmarks, in one go, within one time budget.

Usage: python scripts/gpu_suite.py OUT_DIR [--parts tests,twins,probe,eval,clocks,audit] [--tests "PATHS"]
           [--release RELEASE.jsonl] [--time-budget-s S] [--dry-run]

Parts, in the order given, each a child process with its share of the budget left (its weight in `WEIGHTS`
over the parts still to run), its log and figures under OUT_DIR/PART:
- `tests`: the `gpu`-marked tests of `--tests` (builds run in parallel inside `evaluate_many`);
- `twins`: `bench_trusted_time.py` on the 20 us, launch-bound and 100 us families, four honest twins each
  and a 50 % forger: does each twin's interval hold 1.0, and does its calibration null predict it;
- `probe`: `probe_twin_offset.py`, the launch-bound and 20 us twins as they are and under arms that each
  change one thing (the reference's float64 run, the candidate's cache at import, expandable segments), the
  changed ones also timing the twin again after the import: where the twins' offset at small calls comes from;
- `eval`: `bench_eval.py` on `--release` (throughput, precision, the null test);
- `clocks`: `compare_clocks.py` on `--release` (ten tasks per level under both clocks);
- `audit`: one chunk of the release audit (`audit_release.py chunk`, h100, from `--release`'s folder).
Runs the project from the checkout (PYTHONPATH=src is set for child processes), installs nothing, and
prints a short table last (OUT_DIR/gpu_suite.json).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INTERRUPT_GRACE_S = 30.0  # for pytest to report what ran when the budget ends it
sys.path.insert(0, str(ROOT / "src"))


def run_logged(cmd: list[str], log_path: Path, budget_s: float) -> tuple[int | str, list[str]]:
    """Run `cmd` from the checkout with its output in `log_path`, interrupted at `budget_s` ("timeout"): its
    exit status and the lines it printed."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            rc: int | str = proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            # Interrupt rather than kill: pytest then prints the failures so far and writes its XML report.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = "timeout"
    return rc, log_path.read_text().strip().splitlines()


def tests_command(out: Path, selection: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-m", "gpu and not slow", "-p", "no:cacheprovider", "-rA",
            f"--junitxml={out / 'gpu_tests.xml'}", "-s", *selection.split()]


def run_tests(out: Path, budget_s: float, selection: str) -> dict:
    t0 = time.monotonic()
    rc, lines = run_logged(tests_command(out, selection), out / "gpu_tests.log", budget_s)
    tail = lines[-1:]
    failed = [ln.split(" - ")[0] for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    return {"tests_rc": rc, "tests_s": round(time.monotonic() - t0, 1),
            "tests_summary": tail[0] if tail else "", "tests_failed": failed}


#: Shares of the budget: a part gets its weight over the weights of the parts still to run.
WEIGHTS = {"tests": 3.0, "twins": 2.0, "probe": 2.0, "eval": 2.0, "clocks": 2.0, "audit": 3.0}
PARTS = tuple(WEIGHTS)


def part_command(part: str, out: Path, budget_s: float, release: Path) -> list[str]:
    """The child process of a benchmark part (`tests` runs through `run_tests`)."""
    py, scripts = sys.executable, ROOT / "scripts"
    if part == "twins":
        return [py, str(scripts / "bench_trusted_time.py"), str(out), "--sizes", "20us,launch_bound,100us",
                "--repeat", "4", "--fractions", "0.5"]
    if part == "probe":
        return [py, str(scripts / "probe_twin_offset.py"), str(out), "--repeat", "3",
                "--time-budget-s", str(int(budget_s * 0.9))]
    if part == "eval":
        return [py, str(scripts / "bench_eval.py"), str(out), "--release", str(release), "--null-n", "10",
                "--precision-n", "6", "--time-budget-s", str(int(budget_s * 0.9))]
    if part == "clocks":
        return [py, str(scripts / "compare_clocks.py"), str(out), "--release", str(release), "--per-level", "10",
                "--time-budget-s", str(int(budget_s * 0.9))]
    if part == "audit":
        return [py, str(scripts / "audit_release.py"), "chunk", "--release", release.stem, "--data-dir",
                str(release.parent), "--out", str(out / "chunks"), "--budget-s", str(int(budget_s * 0.75))]
    raise ValueError(f"unknown part {part!r}; choose from {', '.join(PARTS)}")


def run_part(part: str, out: Path, budget_s: float, release: Path) -> dict:
    """One benchmark part as a child process, interrupted at its budget; its exit and the last line it printed."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rc, lines = run_logged(part_command(part, out, budget_s, release), out / "log.txt", budget_s)
    return {f"{part}_rc": rc, f"{part}_s": round(time.monotonic() - t0, 1), f"{part}_last": lines[-1] if lines else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--parts", default="tests", help="comma-separated, of " + ", ".join(PARTS))
    ap.add_argument("--tests", default="tests", help="pytest paths/args for the tests part")
    ap.add_argument("--release", type=Path, default=ROOT.parent / "shared/data/cuda-l1/h100.jsonl",
                    help="the JSONL release of the eval, clocks and audit parts")
    ap.add_argument("--time-budget-s", type=float, default=540.0)
    ap.add_argument("--dry-run", action="store_true", help="print each part's command and budget; run nothing")
    args = ap.parse_args()
    parts = args.parts.split(",")
    unknown = [p for p in parts if p not in WEIGHTS]
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("CUDAL1_STORE", str(args.out_dir / "results.sqlite"))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT),
                                                            os.environ.get("PYTHONPATH", "")) if p)
    start = time.monotonic()
    summary: dict = {}
    planned = 0.0  # (a dry run spends each share on paper)
    for i, part in enumerate(parts):
        left = args.time_budget_s - (planned if args.dry_run else time.monotonic() - start)
        share = max(left * WEIGHTS[part] / sum(WEIGHTS[p] for p in parts[i:]), 30.0)
        if args.dry_run:
            planned += share
            command = " ".join(tests_command(args.out_dir, args.tests) if part == "tests" else
                               part_command(part, args.out_dir / part, share, args.release))
            print(f"{part:7s} {share:6.0f} s  {command}")
        elif part == "tests":
            summary.update(run_tests(args.out_dir, share, args.tests))
        else:
            summary.update(run_part(part, args.out_dir / part, share, args.release))
    if args.dry_run:
        return
    summary["total_s"] = round(time.monotonic() - start, 1)
    (args.out_dir / "gpu_suite.json").write_text(json.dumps(summary, indent=1))
    print("\n== gpu_suite ==")
    for k, v in summary.items():
        print(f"{k:16s} {v}")


if __name__ == "__main__":
    main()
