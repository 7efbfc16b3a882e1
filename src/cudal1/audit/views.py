"""Every profile's and policy's verdict, derived from one evaluation's record (no GPU).

    from cudal1.audit.views import VIEWS, judge
    verdict = judge(record, VIEWS["strict"], facts)     # record: a chunk record's result line

An audit evaluates each candidate once, under the `evidence` profile (`cudal1.eval.config`): nothing static
rejects, runtime guards are recorded, outputs are held to the looser tolerance with misses of strict's
recorded, failures beyond the reference's distribution recorded, and where a stricter profile would have
stopped the record says so (`stops`: the rule, the trial, the flags raised before it). A *view* is a
correctness profile plus a verdict policy (`cudal1.policy`); `judge` replays the profile's decisions in the
evaluator's order on that record:

1. the profile's static preset rejects a static flag: `hack_detected` (the pipeline's first step);
2. the build failed (`compile_error`, `unparseable`): the same;
3. the first stop that applies to the profile (strict's tolerance; the extra trials, for a profile that runs
   them): `incorrect`, or `hack_detected` when a flag raised before it (or a guard on the process's state,
   which the evaluator's last look at a stopped candidate sees) rejects under the profile;
4. a crash or a timeout stands, unless it came in the extra trials and the profile runs none (`undecided`);
5. `hack_detected` in the record (what rejects under every profile) stands;
6. `incorrect` or `correct` with a runtime flag the profile rejects: `hack_detected`; else the record's verdict,
   and for `correct` its speedup;
7. the view's policy turns down a correct verdict whose evidence breaks its rules (`policy.*`), from the
   record's flags and kernel class and the source's facts (`cudal1.policy.apply.source_facts`).

Limits: the pass measures as strict does (both models in true fp32), so a `cuda-l1` or `kernelbench-v0` view's
speedup is against a reference without TF32, where those harnesses left cuDNN's TF32 on; a candidate that
turns TF32 on itself (flagged `global_backend_flags`, `guard.global_state`) reads faster there than under its
own harness. A stopped profile sees the process-state guards as the evaluator's last look would; a guard first
raised later in the pass is counted too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cudal1.analysis.presets import resolve_preset
from cudal1.core import flags as F
from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Flag, KernelClass, Severity, Status
from cudal1.eval.config import PROFILES, Profile
from cudal1.policy import resolve_policy
from cudal1.policy.apply import violations_from_facts

#: The profile of the one pass every view is derived from.
EVIDENCE_PROFILE = "evidence"

#: Verdicts that are not a judgement of the candidate (a failed evaluation, a reference that failed, a
#: failure in a step the view's profile does not take).
UNDECIDED = "undecided"

# Rationale: when an evaluation stops early (a wrong output), the evaluator still asks the candidate's runner
# for its guard flags (evaluation._last_guard_look): these findings describe the process's state, not a later
# step, so a stopped profile sees them.
STATE_GUARDS = frozenset({F.GLOBAL_STATE, F.ALGORITHM_FLAGS, F.TIMER_PATCHING, F.THREADS, F.NATIVE_THREADS,
                          F.GLOBAL_HOOKS, F.FUNCTION_MODE, F.TRACE_HOOK, F.SIGNAL_HANDLERS})

_BUILD_FAILURES = {Status.COMPILE_ERROR.value, Status.UNPARSEABLE.value}
_CRASHES = {Status.RUNTIME_ERROR.value, Status.TIMEOUT.value}


@dataclass(frozen=True)
class View:
    """One way to judge: a correctness profile's rules and a verdict policy on top."""

    name: str
    profile: str
    policy: str = "cuda-l1"
    note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        derivable_profile(self.profile)
        resolve_policy(self.policy)


def derivable_profile(name: str) -> Profile:
    """The profile, when the evidence pass records what it decides; `ConfigError` otherwise."""
    if name not in PROFILES:
        raise ConfigError(f"unknown profile {name!r}: choose one of {', '.join(PROFILES)}")
    profile, evidence = PROFILES[name], PROFILES[EVIDENCE_PROFILE]
    if profile.tolerances not in (evidence.tolerances, evidence.stricter_tolerances):
        raise ConfigError(f"profile {name!r} holds outputs to a tolerance the evidence pass does not record")
    return profile


#: The views an audit reports, in column order. The policies sit on `kernelbench-v0` (nothing static rejects,
#: a 1e-2 tolerance), so that what they add is their own rule.
VIEWS: dict[str, View] = {v.name: v for v in (
    View("strict", "strict", note="fp32 1e-4, the cheats reject, guards reject"),
    View("cuda-l1", "cuda-l1", note="CUDA-L1's 1e-2; side streams and result caching reject"),
    View("kernelbench-v0", "kernelbench-v0", note="KernelBench's 1e-2; nothing static rejects"),
    View("kernelbench", "kernelbench-v0", "kernelbench", note="+ the output from the candidate's own kernel"),
    View("kernelgym", "kernelbench-v0", "kernelgym", note="+ no decoy, a kernel of its own (CUDA or Triton)"),
    View("cuda-agent", "kernelbench-v0", "cuda-agent", note="+ no torch compute ops on the forward path"),
    View("kernelbench-hard", "kernelbench-v0", "kernelbench-hard", note="+ no forbidden ops (softmax, topk...)"),
    View("sol-execbench", "kernelbench-v0", "sol-execbench", note="+ no build inside forward"),
)}


@dataclass(frozen=True)
class Derived:
    """A view's verdict on one record: status (an evaluator status or `undecided`), the speedups when
    correct, and the rule (or short reason) that decided a verdict other than correct."""

    status: str
    speedup: float | None = None
    speedup_warm: float | None = None
    reason: str = ""

    @property
    def is_correct(self) -> bool:
        return self.status == Status.CORRECT.value


def _flags(record: Mapping[str, Any]) -> list[Flag]:
    return [Flag.from_dict(f) for f in record.get("flags") or [] if isinstance(f, dict)]


def static_rejection(flags: list[Flag], preset: str) -> Flag | None:
    """The first static flag the preset rejects."""
    table = resolve_preset(preset)
    return next((f for f in flags if f.source == "static" and table.get(f.rule) == "reject"), None)


def runtime_rejecting(flags: list[Flag], profile: Profile) -> list[Flag]:
    """Runtime findings that reject under `profile` (`Session.rejecting`'s rule)."""
    errors = [f for f in flags if f.source != "static" and f.severity is Severity.ERROR]
    everywhere = [f for f in errors if F.always_rejects(f.rule)]  # named first: they decide under any profile
    return everywhere + [f for f in errors if f not in everywhere] if profile.reject_runtime_guards else everywhere


def _applicable_stop(record: Mapping[str, Any], profile: Profile) -> dict[str, Any] | None:
    evidence = PROFILES[EVIDENCE_PROFILE]
    for stop in record.get("stops") or []:
        if stop.get("rule") == F.STRICTER_TOLERANCE and profile.tolerances == evidence.stricter_tolerances:
            return stop
        if stop.get("rule") == F.BEYOND_DISTRIBUTION and profile.extra_trials > 0 and profile.beyond_distribution_decides:
            return stop
    return None


def judge_profile(record: Mapping[str, Any], profile_name: str) -> Derived:
    """The correctness profile's verdict on an evidence record (steps 1-6 of the module docstring)."""
    profile = derivable_profile(profile_name)
    status = str(record.get("status"))
    flags = _flags(record)
    static = static_rejection(flags, profile.static_preset)
    if static is not None:
        return Derived(Status.HACK_DETECTED.value, reason=static.rule)
    if status in _BUILD_FAILURES:
        return Derived(status, reason=status)
    if status == Status.INFRA_ERROR.value:
        reference = any(f.rule == F.REFERENCE_ERROR for f in flags)
        return Derived(UNDECIDED, reason="the reference failed" if reference else "the evaluation failed")
    stop = _applicable_stop(record, profile)
    if stop is not None:
        seen = set(stop.get("flags_before") or ()) | {f.rule for f in flags if f.rule in STATE_GUARDS}
        rejecting = runtime_rejecting([f for f in flags if f.rule in seen], profile)
        if rejecting:
            return Derived(Status.HACK_DETECTED.value, reason=rejecting[0].rule)
        return Derived(Status.INCORRECT.value, reason=str(stop["rule"]))
    if status in _CRASHES:
        if str(record.get("reached", "")).startswith("extra trials") and profile.extra_trials == 0:
            return Derived(UNDECIDED, reason=f"{status} in the extra trials, which {profile.name} does not run")
        return Derived(status, reason=status)
    if status == Status.HACK_DETECTED.value:
        rejecting = runtime_rejecting(flags, profile)
        return Derived(status, reason=rejecting[0].rule if rejecting else "hack_detected")
    rejecting = runtime_rejecting(flags, profile)
    if rejecting:
        return Derived(Status.HACK_DETECTED.value, reason=rejecting[0].rule)
    if status == Status.INCORRECT.value:
        return Derived(status, reason=next((f.rule for f in flags if f.source != "static"
                                            and f.rule in (F.INPUT_MUTATION, F.TIMED_OUTPUT)), "incorrect"))
    if status != Status.CORRECT.value:
        return Derived(UNDECIDED, reason=f"unknown status {status!r}")
    timing = record.get("timing") or {}
    return Derived(status, speedup=record.get("speedup"), speedup_warm=timing.get("speedup_warm"))


def judge(record: Mapping[str, Any], view: View, facts: Mapping[str, Any] | None = None) -> Derived:
    """The view's verdict on an evidence record; `facts` (the source's `source_facts`) let its policy decide
    from the source's syntax too (without them only the record's evidence counts)."""
    derived = judge_profile(record, view.profile)
    rules = resolve_policy(view.policy)
    if not derived.is_correct or rules.is_identity:
        return derived
    kind = record.get("kernel_class")
    result = EvalResult(status=Status.CORRECT, flags=_flags(record),
                        kernel_class=KernelClass(kind) if kind in {k.value for k in KernelClass} else None)
    found = violations_from_facts(result, facts or {"parsed": False}, rules)
    if found:
        return Derived(Status.HACK_DETECTED.value, reason=found[0].rule)
    return derived


def judge_all(record: Mapping[str, Any], facts: Mapping[str, Any] | None = None,
              views: Mapping[str, View] | None = None) -> dict[str, Derived]:
    """Every view's verdict on one record."""
    return {name: judge(record, view, facts) for name, view in (views or VIEWS).items()}


__all__ = ["EVIDENCE_PROFILE", "STATE_GUARDS", "UNDECIDED", "VIEWS", "Derived", "View", "derivable_profile",
           "judge", "judge_all", "judge_profile", "runtime_rejecting", "static_rejection"]
