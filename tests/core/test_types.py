"""The wire types of the ground floor: stable values and lossless JSON round trips."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from cudal1.core.types import EvalResult, Flag, KernelClass, Mismatch, Severity, Status, TimingStats

CORE = Path(__file__).resolve().parents[2] / "src" / "cudal1" / "core"


def test_status_values_are_the_wire_contract():
    assert [s.value for s in Status] == ["unparseable", "compile_error", "runtime_error", "timeout", "incorrect",
                                         "hack_detected", "correct", "infra_error"]


def test_eval_result_round_trips_through_json():
    result = EvalResult(
        status=Status.CORRECT, message="ok", task_id="t", candidate_hash="h", speedup=1.5,
        timing=TimingStats(ref_ms=2.0, candidate_ms=1.0, speedup=1.5, stability=0.01, bucket_speedups=[1.5]),
        flags=[Flag("guard.threads", Severity.WARNING, "grew", source="runtime")],
        kernel_class=KernelClass.CUSTOM_CUDA,
        mismatch=Mismatch(0, 1, 0.5, 0.1, 3, 10, [1, 2], 1.0, 1.5, atol=1e-4, rtol=1e-4),
        protocol={"version": "4"}, environment={"gpu_name": "cpu"}, duration_s=3.0)
    again = EvalResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result


def test_timing_stats_from_a_newer_writer_keeps_known_fields():
    d = {"ref_ms": 1.0, "candidate_ms": 0.5, "speedup": 2.0, "stability": 0.0, "bucket_speedups": [2.0],
         "a_field_from_the_future": 7}
    stats = TimingStats.from_dict(d)
    assert stats.speedup == 2.0 and not hasattr(stats, "a_field_from_the_future")


def test_the_ground_floor_imports_nothing_above_it():
    for path in CORE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith("cudal1.") or name.startswith("cudal1.core"), (path.name, name)
