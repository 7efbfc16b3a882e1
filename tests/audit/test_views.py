"""One evidence pass, every view: the verdicts `cudal1.audit.views` derives from an `evidence` evaluation's
record equal those of evaluating directly under each profile (CPU, real runners), and the derivation's rules
on synthetic records."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal1.audit.records import compact_result
from cudal1.audit.views import UNDECIDED, VIEWS, View, judge, judge_all, judge_profile
from cudal1.core.errors import ConfigError
from cudal1.eval import EvalConfig, evaluate_candidate
from cudal1.policy.apply import source_facts
from cudal1.tasks.sources import load_file

FIXTURES = Path(__file__).parent.parent / "fixtures"
FAST = dict(device="cpu", sizes="full", correctness_trials=2, buckets=2, target_bucket_ms=5.0, warm_buckets=1,
            warmup_iters=1, timeout_s=60.0)


@pytest.fixture(scope="module")
def task():
    return load_file(FIXTURES / "tasks" / "tiny_scale_add.py")


def _evaluate(task, name: str, profile: str):
    source = (FIXTURES / "eval" / f"{name}.py").read_text()
    return evaluate_candidate(task, source, EvalConfig(**FAST, profile=profile))


@pytest.mark.parametrize("name, direct", [
    # 3e-4 off: outside strict's 1e-4 (no static flag), inside 1e-2: strict stops at its first trial.
    ("slightly_off", {"strict": "incorrect", "cuda-l1": "correct"}),
    # Sets TF32 flags: strict rejects the source; cuda-l1 runs it (its guards only report). The old profile
    # spelling `cuda-l1` (loose measured, judged by the cuda-l1 policy) still gives its verdict.
    ("flag_flip", {"strict": "hack_detected", "cuda-l1": "correct"}),
])
def test_derived_verdicts_equal_direct_evaluations(task, name, direct):
    evidence = _evaluate(task, name, "evidence")
    assert evidence.status.value == "correct", evidence.message
    record = compact_result(evidence, task_id=task.id, task_hash=task.hash, candidate_hash="c")
    for profile, expected in direct.items():
        assert _evaluate(task, name, profile).status.value == expected, profile
        derived = judge_profile(record, profile)
        assert derived.status == expected, (profile, derived)
        assert (derived.speedup is not None) == (expected == "correct")
    if name == "slightly_off":
        stop = record["stops"][0]
        assert stop["rule"] == "evidence.stricter_tolerance" and stop["trial"] == 0
        assert stop["mismatch"]["atol"] == pytest.approx(1e-4) and record["reached"] == "done"


def _record(status="correct", flags=(), stops=(), reached="done", kernel_class="pytorch_only", speedup=2.0):
    return {"status": status, "speedup": speedup if status == "correct" else None, "kernel_class": kernel_class,
            "flags": [{"rule": r, "severity": s, "source": src, "line": 3, "message": ""} for r, s, src in flags],
            "stops": list(stops), "reached": reached, "timing": {"speedup_warm": 1.5}}


def test_a_static_flag_rejects_only_where_the_preset_rejects_it():
    record = _record(flags=[("precision_downcast", "error", "static")])
    verdicts = judge_all(record)
    assert verdicts["strict"].status == "hack_detected" and verdicts["strict"].reason == "precision_downcast"
    assert verdicts["cuda-l1"].status == "correct" and verdicts["cuda-l1"].speedup == 2.0
    assert verdicts["cuda-l1"].speedup_warm == 1.5


def test_a_runtime_guard_rejects_where_the_profile_rejects_guards_and_always_rejecting_ones_everywhere():
    guarded = _record(flags=[("guard.threads", "error", "runtime")])
    assert judge_profile(guarded, "strict").status == "hack_detected"
    assert judge_profile(guarded, "loose", "cuda-l1").status == "correct"
    clock = _record(status="hack_detected", flags=[("timing.outside_clock", "error", "runtime")])
    assert {v.status for v in judge_all(clock).values()} == {"hack_detected"}


def test_the_first_stop_decides_what_the_stopped_profile_saw():
    """Strict stops at the stricter miss: a precision flag raised after it is not seen (incorrect), a guard on
    the process's state is (hack_detected), and a later crash is not strict's verdict."""
    stop = {"rule": "evidence.stricter_tolerance", "trial": 0, "flags_before": [], "mismatch": None}
    later = _record(status="runtime_error", flags=[("guard.reduced_precision", "error", "runtime")], stops=[stop])
    assert judge_profile(later, "strict").status == "incorrect"
    assert judge_profile(later, "loose", "cuda-l1").status == "runtime_error"
    threads = _record(flags=[("guard.threads", "error", "runtime")], stops=[stop])
    assert judge_profile(threads, "strict").status == "hack_detected"
    before = _record(flags=[("guard.reduced_precision", "error", "runtime")],
                     stops=[{**stop, "flags_before": ["guard.reduced_precision"]}])
    assert judge_profile(before, "strict").reason == "guard.reduced_precision"


def test_beyond_distribution_stops_profiles_with_extra_trials_and_crashes_there_are_undecided_without():
    stop = {"rule": "runtime.beyond_distribution", "trial": 5, "flags_before": [], "mismatch": None}
    assert judge_profile(_record(stops=[stop]), "strict").status == "incorrect"
    assert judge_profile(_record(stops=[stop]), "loose", "cuda-l1").status == "correct"
    crash = _record(status="timeout", reached="extra trials")
    assert judge_profile(crash, "strict").status == "timeout"
    assert judge_profile(crash, "loose", "cuda-l1").status == UNDECIDED


def test_build_failures_and_reference_failures():
    assert {v.status for v in judge_all(_record(status="compile_error")).values()} == {"compile_error"}
    reference = _record(status="infra_error", flags=[("reference_error", "warning", "runtime")])
    derived = judge_profile(reference, "strict")
    assert derived.status == UNDECIDED and "reference" in derived.reason


def test_policies_decide_from_the_records_evidence_and_the_source_facts():
    source = (FIXTURES / "eval" / "correct.py").read_text()
    facts = source_facts(source)
    assert facts["parsed"] and facts["torch_compute_calls"][0][0] == "torch.add"
    record = _record(kernel_class="pytorch_only")
    assert judge(record, VIEWS["kernelbench"], facts).reason == "policy.own_kernel"
    custom = _record(kernel_class="custom_cuda")
    assert judge(custom, VIEWS["kernelbench"], facts).status == "correct"
    assert judge(custom, VIEWS["cuda-agent"], facts).reason == "policy.torch_op"
    assert judge(custom, VIEWS["sol-execbench"], facts).status == "correct"


def test_a_view_needs_a_profile_the_pass_can_derive():
    with pytest.raises(ConfigError, match="unknown profile"):
        View("x", "no-such-profile")
    assert judge_profile(_record(), "trusted").status == "correct"
