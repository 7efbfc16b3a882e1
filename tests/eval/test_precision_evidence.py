"""Reduced-precision compute found from the run, not from names: the first trial of a float32 task also runs
the reference in float64, and a candidate whose error is far above the float32 reference's own is flagged
(`guard.reduced_precision`); a policy may reject it. Real CPU evaluations through the isolated runners."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudal1.core import flags as F
from cudal1.eval import EvalConfig, Status, evaluate_candidate
from cudal1.eval.correctness import PRECISION_FLOOR, precision_evidence
from cudal1.policy import apply_policy
from cudal1.tasks.sources import load_file

FIXTURES = Path(__file__).parent.parent / "fixtures"
FAST = dict(device="cpu", sizes="full", correctness_trials=2, buckets=2, target_bucket_ms=5.0, warm_buckets=0,
            warmup_iters=1, timeout_s=60.0, profile="cuda-l1")


@pytest.fixture(scope="module")
def task():
    return load_file(FIXTURES / "precision" / "task_matmul.py")


def evaluate(task, name, **overrides):
    source = (FIXTURES / "precision" / f"{name}.py").read_text()
    return source, evaluate_candidate(task, source, EvalConfig(**{**FAST, **overrides}))


def test_fp16_arithmetic_behind_a_computed_name_is_found_from_the_run(task, tmp_path):
    source, result = evaluate(task, "half_hidden")
    # Within CUDA-L1's 1e-2 tolerance, and no static rule names it: the run is the evidence.
    assert result.status is Status.CORRECT, result.message
    flag = next(f for f in result.flags if f.rule == F.REDUCED_PRECISION)
    assert "reduced precision" in flag.message
    evidence = result.protocol["precision"]
    assert evidence["cand_errors"][0] > 100 * evidence["ref_errors"][0] and evidence["cand_errors"][0] > PRECISION_FLOOR
    policy = tmp_path / "no_downcasts.yaml"
    policy.write_text("base: cuda-l1\nreject_reduced_precision: true\n")
    judged = apply_policy(result, source, str(policy), task_source=task.source)
    assert judged.status is Status.HACK_DETECTED and "policy.reduced_precision" in {f.rule for f in judged.flags}


def test_float32_in_another_summation_order_is_not_flagged(task, tmp_path):
    source, result = evaluate(task, "fp32_other_order")
    assert result.status is Status.CORRECT, result.message
    assert F.REDUCED_PRECISION not in {f.rule for f in result.flags}
    evidence = result.protocol["precision"]
    assert evidence["cand_errors"][0] < 10 * evidence["ref_errors"][0]
    policy = tmp_path / "no_downcasts.json"
    policy.write_text(json.dumps({"reject_reduced_precision": True}))
    assert apply_policy(result, source, str(policy), task_source=task.source).status is Status.CORRECT


def test_evidence_can_be_switched_off_and_says_why_it_is_missing(task):
    _, result = evaluate(task, "fp32_other_order", precision_evidence=False)
    assert result.status is Status.CORRECT and "precision" not in result.protocol
    fp8 = load_file(FIXTURES / "tasks" / "fp8_in_out.py")
    ok = fp8.source.replace("class Model(", "class ModelNew(")
    result = evaluate_candidate(fp8, ok, EvalConfig(**FAST))
    assert result.status is Status.CORRECT, result.message
    assert result.protocol["precision"] == {"skipped": "no float32 output"}


@pytest.mark.parametrize(("ref", "cand", "flagged"), [
    (1e-7, 3e-4, True),     # fp16 products in a float32 matmul
    (1e-7, 3e-7, False),    # another float32 summation order
    (0.0, 1e-6, False),     # an exact reference (relu): last-bit differences stay under the floor
    (5e-4, 2e-3, False),    # a reference itself at TF32 level: a candidate at that level is not a downcast
    (5e-4, 3e-2, True),     # ...but bf16 below it is
    (None, 1.0, False),     # not measured
])
def test_the_rule(ref, cand, flagged):
    assert (precision_evidence([ref], [cand]) is not None) is flagged


@pytest.mark.gpu
def test_on_the_gpu_the_helper_measures_the_same_evidence(task):
    # On a GPU the helper compares (device arenas); its errors must reach the parent as on the CPU.
    _, low = evaluate(task, "half_hidden", device="cuda")
    _, honest = evaluate(task, "fp32_other_order", device="cuda")
    print("gpu precision", low.protocol.get("precision"), honest.protocol.get("precision"))
    assert low.status is Status.CORRECT and F.REDUCED_PRECISION in {f.rule for f in low.flags}
    assert honest.status is Status.CORRECT and F.REDUCED_PRECISION not in {f.rule for f in honest.flags}


@pytest.mark.parametrize(("calls", "where"), [(1, "correctness trial 1"), (2, "a timed call")])
def test_full_precision_only_where_it_is_expected_to_be_checked_is_still_found(tmp_path, capsys, calls, where):
    # Through the real CLI: exact on the first call (or on every trial), fp16 afterwards. Every later trial
    # and every verified timed call is held to the reference's error measured on the first trial. One call
    # per bracket here, so that a trial is one call of each model.
    from cudal1.cli.main import main

    candidate = tmp_path / "candidate.py"
    candidate.write_text((FIXTURES / "precision" / "half_after_calls.py").read_text()
                         .replace("CALLS = 1", f"CALLS = {calls}"))
    assert main(["eval", "--ref", str(FIXTURES / "precision" / "task_matmul.py"), "--candidate", str(candidate),
                 "--device", "cpu", "--trials", "2", "--buckets", "2", "--profile", "cuda-l1", "--json",
                 "--no-store", "--bracket-work-ms", "0"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    flags = [f for f in result["flags"] if f["rule"] == F.REDUCED_PRECISION]
    assert flags and flags[0]["message"].startswith(where), result["flags"]


def test_every_call_of_a_trials_bracket_is_held_to_the_reference_error():
    # Three calls per bracket: exact on the first call only, fp16 on the second, which is in the first trial.
    task = load_file(FIXTURES / "precision" / "task_matmul.py")
    source = (FIXTURES / "precision" / "half_after_calls.py").read_text()
    result = evaluate_candidate(task, source, EvalConfig(**{**FAST, "profile": "cuda-l1", "bracket_work_ms": 1e3,
                                                            "max_calls_per_bracket": 3}))
    assert result.protocol["clock"]["calls_per_bracket"] == 3
    flags = [f for f in result.flags if f.rule == F.REDUCED_PRECISION]
    assert flags and flags[0].message.startswith("correctness trial 0, call 1"), result.flags
