"""The split of the evaluator's options: a profile says how to measure, a policy what rejects, resolved once
(`eval.config.resolve_judging`) and decided by one rule (`policy.decide.decide`). Each test here would have
failed before the split: the profile held the static preset and whether guards reject, the evaluator, the
audit's views and the pipeline each read them, and `cuda-l1` named a profile and a policy."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from cudal1.audit.views import judge_profile
from cudal1.core import flags as F
from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Flag, Severity, Status
from cudal1.eval.config import PROFILE_POLICIES, PROFILES, EvalConfig, Profile, resolve_judging
from cudal1.policy import PRESETS, decide, rejudge

STATIC_THREADS = Flag("threads_or_processes", Severity.ERROR, "starts a thread", source="static")
GUARD_THREADS = F.runtime_flag(F.THREADS, "the candidate started Python threads")
CLOCK = F.runtime_flag(F.OUTSIDE_CLOCK, "the times disagree")
NOTE = F.runtime_flag(F.NOISY, "noisy")


def test_a_profile_holds_no_rejection_knob():
    fields = {f.name for f in dataclasses.fields(Profile)}
    assert fields == {"name", "tolerances", "exact_fp32", "require_sandbox", "extra_trials",
                      "stricter_tolerances", "beyond_distribution_decides", "description"}
    assert {f.name for f in dataclasses.fields(PRESETS["guarded"])} >= {"static_preset", "reject_runtime_guards"}
    # every profile measures differently from every other (no two names for one measurement)
    measured = [dataclasses.replace(p, name="", description="") for p in PROFILES.values()]
    assert len({repr(m) for m in measured}) == len(measured)


def test_one_place_turns_options_into_a_profile_and_a_policy():
    for name in PROFILES:
        profile, policy = resolve_judging(name)
        assert profile.name == name and policy.name == PROFILE_POLICIES[name]
    profile, policy = resolve_judging("strict", "kernelbench")
    assert (profile.name, policy.name, policy.static_preset, policy.reject_runtime_guards) == (
        "strict", "kernelbench", "kernelbench-v0", False)
    cfg = EvalConfig(device="cpu", profile=" strict ")
    assert cfg.profile == "strict" and cfg.judging == resolve_judging("strict") and cfg.policy_obj.name == "guarded"
    with pytest.raises(ConfigError, match="unknown profile"):
        EvalConfig(profile="no-such")


@pytest.mark.parametrize(("old", "profile", "policy"), [
    ("cuda-l1", "loose", "cuda-l1"), ("kernelbench-v0", "loose", "kernelbench-v0"),
    ("kernelbench", "loose", "kernelbench-v0")])
def test_an_old_profile_spelling_still_works_with_one_warning(old, profile, policy, caplog):
    with caplog.at_level(logging.WARNING, logger="cudal1.eval.config"):
        cfg = EvalConfig(device="cpu", profile=old)
    assert (cfg.profile, cfg.policy_obj.name) == (profile, policy)
    warnings = [r for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    # a policy named beside the old spelling is kept
    assert EvalConfig(device="cpu", profile=old, policy="kernelgym").policy_obj.name == "kernelgym"
    # the old spelling measures and rejects as it did: its policy holds its old static preset
    assert cfg.policy_obj.static_preset == {"cuda-l1": "cuda-l1"}.get(old, "kernelbench-v0")
    assert not cfg.policy_obj.reject_runtime_guards


def test_the_old_default_policy_beside_strict_warns_that_its_meaning_changed(caplog):
    with caplog.at_level(logging.WARNING, logger="cudal1.eval.config"):
        cfg = EvalConfig(device="cpu", profile="strict", policy="cuda-l1")  # an old saved config's pair
    assert cfg.policy_obj.name == "cuda-l1" and any("before 2026-12-07" in r.getMessage() for r in caplog.records)


def test_a_default_runs_cache_key_is_unchanged_and_another_policy_is_another_key():
    key = EvalConfig(device="cpu").protocol()
    assert key["profile"] == "strict" and "policy" not in key
    assert EvalConfig(device="cpu", policy="guarded").protocol() == key
    other = EvalConfig(device="cpu", policy="cuda-l1").protocol()
    assert other["policy"]["static_preset"] == "cuda-l1"
    assert "policy" not in EvalConfig(device="cpu", profile="loose").protocol()


def test_decide_names_the_rule_that_rejects_each_flag():
    flags = [STATIC_THREADS, GUARD_THREADS, CLOCK, NOTE]
    guarded = {row.flag.rule: row.rejected_by for row in decide(flags, "guarded").rows}
    assert guarded == {"threads_or_processes": "static preset strict", F.THREADS: "reject_runtime_guards (guarded)",
                       F.OUTSIDE_CLOCK: "every policy (RUNTIME_FLAGS: always_rejects)", F.NOISY: ""}
    loose = decide(flags, "kernelbench-v0")
    assert loose.rejected == [CLOCK] and loose.reason is CLOCK
    assert not decide([STATIC_THREADS, GUARD_THREADS, NOTE], "cuda-l1").rejects
    later = [F.runtime_flag(F.RECHECK_DISAGREE, "not reproducible"), Flag(F.JUDGE_CHEATS, Severity.ERROR, "x",
                                                                          source="judge")]
    assert [row.rejected_by for row in decide(later, "kernelbench-v0").rows] == [
        "the re-check on a second GPU", "the LLM judge (reject_on_cheat)"]


def test_the_views_reject_by_the_policy_not_the_profile():
    record = {"status": "correct", "speedup": 1.3, "flags": [GUARD_THREADS.to_dict()]}
    assert judge_profile(record, "strict").status == "hack_detected"  # strict's policy: guarded
    assert judge_profile(record, "strict", "kernelbench-v0").status == "correct"  # same measurement, other rules
    assert judge_profile(record, "loose", "guarded").status == "hack_detected"


def test_a_stored_row_rejudged_under_another_policy_gets_that_policys_verdict_without_running(monkeypatch):
    import cudal1.eval.pipeline as pipeline

    monkeypatch.setattr(pipeline, "evaluate_candidate", lambda *a, **k: pytest.fail("ran again"))
    stored = EvalResult(status=Status.CORRECT, speedup=1.4, task_id="t", flags=[GUARD_THREADS, NOTE],
                        protocol={"profile": "evidence", "policy": "kernelbench-v0"})
    strict = rejudge(stored, "guarded")
    assert strict.status is Status.HACK_DETECTED and strict.speedup is None
    assert (strict.profile, strict.policy) == ("evidence", "guarded")
    assert strict.protocol["policy_rules"]["reject_runtime_guards"]
    assert rejudge(stored, "cuda-l1").status is Status.CORRECT
    # a rejection that stopped the run cannot be undone from the record: no verdict, not a guess
    assert rejudge(strict, "cuda-l1").status is Status.INFRA_ERROR


def test_a_kernel_forms_scan_flags_are_judged_like_runtime_findings():
    """A timer read in a kernel-form cubin rejects where runtime guards reject; a forbidden construct (a
    device-side launch) rejects under every policy. Both come from the parent's scan (`source` "build")."""
    timer = F.runtime_flag(F.KERNEL_TIMER_READ, "reads %globaltimer (PTX)", source="build")
    scan = F.runtime_flag(F.KERNEL_SCAN_REJECTED, "device-runtime symbols", source="build")
    assert [row.rejected_by for row in decide([timer, scan], "guarded").rows] == [
        "reject_runtime_guards (guarded)", "every policy (RUNTIME_FLAGS: always_rejects)"]
    for policy in ("cuda-l1", "kernelbench-v0"):
        assert decide([timer, scan], policy).rejected == [scan]
