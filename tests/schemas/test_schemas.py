"""The JSON Schemas in cudal1/schemas/ (read through cudal1.core.schemas): valid schemas, what they accept and
refuse, and the project's own examples conforming."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from cudal1.core.schemas import SCHEMA_DIR, SCHEMAS, load_schema, schema_problems
from cudal1.core.types import EvalResult, Flag, Severity, Status, TimingStats

RELEASES = Path(__file__).resolve().parents[3] / "shared" / "data" / "cuda-l1"


def test_every_schema_file_is_a_valid_schema_and_is_listed():
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.schema.json")) == sorted(f"{n}.schema.json" for n in SCHEMAS)
    for name in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(load_schema(name))


def test_a_release_row_problem_names_the_field_what_it_holds_and_what_was_expected():
    row = {"level_id": 1, "task_id": None, "ref_code": "x" * 100, "score_default": "fast", "score_cudnn": "2.5",
           "score_tf32": "None"}
    assert schema_problems("release_row", row) == [
        'score_default is "fast", not a published speedup: a number >= 0 or null (a string spelling one, "2.5" '
        'or "None", is read as it)',
        "task_id is null, not an integer >= 0 or a non-empty name without '/' or spaces (the task within its level)"]
    assert schema_problems("release_row", {"level_id": 1, "task_id": "7_conv", "ref_code": "x", "notes": 3}) == []
    assert schema_problems("release_row", {"level_id": 1, "task_id": 1, "ref_code": 7}) == [
        "ref_code is 7, not the reference module's source, a non-empty string"]


@pytest.mark.skipif(not RELEASES.is_dir(), reason="the CUDA-L1 releases are not present")
def test_the_cuda_l1_releases_conform():
    for path in sorted(RELEASES.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if "ref_code" not in rows[0]:
            continue  # a baseline variant file (level_id, task_id, code), not a release
        assert all(schema_problems("release_row", r) == [] for r in rows), path


def test_verdicts_conform_and_broken_ones_do_not():
    timing = TimingStats(ref_ms=1.0, candidate_ms=0.5, speedup=2.0, stability=0.1, bucket_speedups=[2.0, 2.1],
                         speedup_ci=[1.8, 2.2])
    good = EvalResult(Status.CORRECT, task_id="t", candidate_hash="a" * 64, speedup=2.0, timing=timing,
                      flags=[Flag("r", Severity.INFO, "m")], duration_s=1.0)
    assert schema_problems("eval_result", good.to_dict()) == []
    assert schema_problems("eval_result", EvalResult(Status.INFRA_ERROR, message="x").to_dict()) == []
    assert schema_problems("server_answers", {"results": [good.to_dict()]}) == []
    assert schema_problems("server_answers", {"detail": "the body is not valid JSON"}) == []
    broken = {**good.to_dict(), "status": "great", "speedup": -1}
    assert schema_problems("eval_result", broken) == [
        "speedup is -1, not a speedup > 0 or null (null unless correct)", 'status is "great", not one of the statuses']
    assert schema_problems("server_answers", {"detail": "two\nlines"}) != []
