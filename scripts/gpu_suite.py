#!/usr/bin/env python3
"""The GPU tests in one go (builds run in parallel inside `evaluate_many`), with a time budget.

Usage: python scripts/gpu_suite.py OUT_DIR [--tests "PATHS"] [--time-budget-s S]
Runs the project from the checkout (PYTHONPATH=src is set for child processes), installs nothing,
writes full results under OUT_DIR and prints a short table last.
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


def run_tests(out: Path, budget_s: float, selection: str) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu and not slow", "-p", "no:cacheprovider", "-rA",
           f"--junitxml={out / 'gpu_tests.xml'}", "-s", *selection.split()]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    with open(out / "gpu_tests.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            # Interrupt rather than kill: pytest then prints the failures so far and writes its XML report.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = "timeout"
    lines = (out / "gpu_tests.log").read_text().strip().splitlines()
    tail = lines[-1:]
    failed = [ln.split(" - ")[0] for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    return {"tests_rc": rc, "tests_s": round(time.monotonic() - t0, 1),
            "tests_summary": tail[0] if tail else "", "tests_failed": failed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--parts", default="tests")
    ap.add_argument("--tests", default="tests", help="pytest paths/args for the tests part")
    ap.add_argument("--time-budget-s", type=float, default=540.0)
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("CUDAL1_STORE", str(args.out_dir / "results.sqlite"))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT),
                                                            os.environ.get("PYTHONPATH", "")) if p)
    start = time.monotonic()
    summary: dict = {}
    parts = args.parts.split(",")
    if "tests" in parts:
        left = args.time_budget_s - (time.monotonic() - start)
        summary.update(run_tests(args.out_dir, max(left, 30.0), args.tests))
    summary["total_s"] = round(time.monotonic() - start, 1)
    (args.out_dir / "gpu_suite.json").write_text(json.dumps(summary, indent=1))
    print("\n== gpu_suite ==")
    for k, v in summary.items():
        print(f"{k:16s} {v}")


if __name__ == "__main__":
    main()
