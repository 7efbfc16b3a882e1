#!/usr/bin/env python3
"""Everything GPU-side in one go: build cache warm-up, the GPU tests, then the benchmarks.

Usage: python scripts/gpu_suite.py OUT_DIR [--parts tests,eval,build,audit] [--time-budget-s S]
Runs the project from the checkout (PYTHONPATH=src is set for child processes), installs nothing,
writes full results under OUT_DIR and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def load_inline_sources() -> list[str]:
    """Every `load_inline` candidate the GPU tests will evaluate (built once, in parallel)."""
    paths = list((ROOT / "src/cudal1/tasks/builtin/examples").glob("*.py"))
    paths += list((ROOT / "tests/fixtures/candidates").rglob("*.py"))
    return [p.read_text() for p in paths if "load_inline" in p.read_text()]


def run_prebuild(out: Path) -> dict:
    from cudal1.eval import EvalConfig
    from cudal1.eval.pipeline import prebuild

    sources = load_inline_sources()
    t0 = time.monotonic()
    prebuild(sources, EvalConfig(device="cuda").resolved("cuda"))
    return {"prebuilt": len(sources), "prebuild_s": round(time.monotonic() - t0, 1)}


def run_tests(out: Path, budget_s: float, selection: str) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu and not slow", "-p", "no:cacheprovider", "-rA",
           f"--junitxml={out / 'gpu_tests.xml'}", "-s", *selection.split()]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    with open(out / "gpu_tests.log", "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=budget_s, check=False)
    tail = (out / "gpu_tests.log").read_text().strip().splitlines()[-1:]
    return {"tests_rc": proc.returncode, "tests_s": round(time.monotonic() - t0, 1),
            "tests_summary": tail[0] if tail else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--parts", default="prebuild,tests")
    ap.add_argument("--tests", default="tests", help="pytest paths/args for the tests part")
    ap.add_argument("--time-budget-s", type=float, default=540.0)
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("CUDAL1_STORE", str(args.out_dir / "results.sqlite"))
    os.environ["PYTHONPATH"] = f"{ROOT / 'src'}:{ROOT}"
    start = time.monotonic()
    summary: dict = {}
    parts = args.parts.split(",")
    if "prebuild" in parts:
        summary.update(run_prebuild(args.out_dir))
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
