"""`scripts/gpu_suite.py`: the GPU tests and the benchmarks in one run, each part within its share of the budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.scripts import SCRIPTS, load_script


def test_each_part_gets_its_weight_of_what_is_left_and_a_dry_run_says_so(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPTS / "gpu_suite.py"), str(tmp_path), "--parts",
                           "tests,twins,eval,clocks", "--time-budget-s", "900", "--dry-run",
                           "--release", "data/h100.jsonl"], capture_output=True, text=True, check=True)
    rows = [line.split() for line in proc.stdout.strip().splitlines()]
    assert [r[0] for r in rows] == ["tests", "twins", "eval", "clocks"]
    shares = [float(r[1]) for r in rows]
    assert abs(sum(shares) - 900) < 2, shares  # (printed rounded)
    assert abs(shares[0] - 900 * 3 / 9) < 1 and abs(shares[2] - shares[3]) < 1, shares
    assert "--per-level 10" in proc.stdout and "launch_bound" in proc.stdout
    assert not any(tmp_path.iterdir()), "a dry run writes nothing"


def test_an_unknown_part_is_refused_before_anything_runs(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPTS / "gpu_suite.py"), str(tmp_path / "out"), "--parts",
                           "tests,bench"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown part(s) bench" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_audit_part_runs_one_chunk_of_the_release_named_by_its_file():
    suite = load_script("gpu_suite")
    command = suite.part_command("audit", Path("/o/audit"), 400, Path("/d/h100.jsonl"))
    assert command[2:] == ["chunk", "--release", "h100", "--data-dir", "/d", "--out", "/o/audit/chunks",
                           "--budget-s", "300"]


def test_the_probe_part_runs_the_twin_offset_arms_within_its_share():
    suite = load_script("gpu_suite")
    command = suite.part_command("probe", Path("/o/probe"), 300, Path("/d/h100.jsonl"))
    assert command[1].endswith("probe_twin_offset.py") and command[2:] == ["/o/probe", "--repeat", "3",
                                                                            "--time-budget-s", "270"]
