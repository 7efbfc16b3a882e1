"""Every view's verdict (a profile and a policy), derived from one evaluation's record (no GPU).

    from cudal1.audit.views import VIEWS, judge
    verdict = judge(record, VIEWS["strict"], facts)     # record: a chunk record's result line

An audit evaluates each candidate once, under the `evidence` profile (`cudal1.eval.config`) and its policy
`kernelbench-v0`: nothing static rejects, runtime guards are recorded, outputs are held to the looser tolerance with misses of strict's
recorded, failures beyond the reference's distribution recorded, and where a stricter profile would have
stopped the record says so (`stops`: the rule, the trial, the flags raised before it). A *view* is a
correctness profile (how it measures: where it stops) plus a verdict policy (what rejects: `cudal1.policy`);
`judge` replays the evaluator's decisions in its order on that record, every rejection by the policy's one
rule (`cudal1.policy.decide.decide`):

1. the policy's static preset rejects a static flag: `hack_detected` (the pipeline's first step);
2. the build failed (`compile_error`, `unparseable`): the same;
3. the first stop that applies to the profile (strict's tolerance; the extra trials, for a profile that runs
   them): `incorrect`, or `hack_detected` when a flag raised before it (or a guard on the process's state,
   which the evaluator's last look at a stopped candidate sees) rejects under the policy;
4. a crash or a timeout stands, unless it came in the extra trials and the profile runs none (`undecided`);
5. `hack_detected` in the record (what rejects under every policy) stands;
6. `incorrect` or `correct` with a runtime flag the policy rejects: `hack_detected`; else the record's verdict,
   and for `correct` its speedup;
7. the policy's harness rules turn down a correct verdict whose evidence breaks them (`policy.*`), from the
   record's flags and kernel class and the source's facts (`cudal1.policy.apply.source_facts`).

Limits: the pass measures as strict does (both models in true fp32), so a `loose` view's
speedup is against a reference without TF32, where those harnesses left cuDNN's TF32 on; a candidate that
turns TF32 on itself (flagged `global_backend_flags`, `guard.global_state`) reads faster there than under its
own harness. A stopped profile sees the process-state guards as the evaluator's last look would; a guard first
raised later in the pass is counted too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cudal1.core import flags as F
from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Flag, KernelClass, Status
from cudal1.eval.config import PROFILES, Profile, canonical_options, resolve_judging
from cudal1.policy import Policy, decide
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
    """One way to judge: a correctness profile (how it measures) and a verdict policy (what rejects; empty:
    the profile's)."""

    name: str
    profile: str
    policy: str = ""
    note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        derivable_profile(resolve_judging(self.profile, self.policy)[0])


def derivable_profile(name: str | Profile) -> Profile:
    """The profile, when the evidence pass records what it decides; `ConfigError` otherwise."""
    profile = name if isinstance(name, Profile) else PROFILES[canonical_options(name)[0]]
    evidence = PROFILES[EVIDENCE_PROFILE]
    if profile.tolerances not in (evidence.tolerances, evidence.stricter_tolerances):
        raise ConfigError(f"profile {name!r} holds outputs to a tolerance the evidence pass does not record")
    return profile


#: The views an audit reports, in column order. The harness policies sit on `kernelbench-v0` (nothing static
#: rejects) and are measured `loose` (1e-2), so that what they add is their own rule.
VIEWS: dict[str, View] = {v.name: v for v in (
    View("strict", "strict", "guarded", note="fp32 1e-4, the cheats reject, guards reject"),
    View("cuda-l1", "loose", "cuda-l1", note="CUDA-L1's 1e-2; side streams and result caching reject"),
    View("kernelbench-v0", "loose", "kernelbench-v0", note="KernelBench's 1e-2; nothing static rejects"),
    View("kernelbench", "loose", "kernelbench", note="+ the output from the candidate's own kernel"),
    View("kernelgym", "loose", "kernelgym", note="+ no decoy, a kernel of its own (CUDA or Triton)"),
    View("cuda-agent", "loose", "cuda-agent", note="+ no torch compute ops on the forward path"),
    View("kernelbench-hard", "loose", "kernelbench-hard", note="+ no forbidden ops (softmax, topk...)"),
    View("sol-execbench", "loose", "sol-execbench", note="+ no build inside forward"),
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


def static_rejection(flags: list[Flag], policy: Policy) -> Flag | None:
    """The first static flag the policy rejects (its static preset)."""
    return decide([f for f in flags if f.source == "static"], policy).reason


def runtime_rejection(flags: list[Flag], policy: Policy) -> Flag | None:
    """The runtime finding that names the policy's rejection (one that rejects under every policy first)."""
    return decide([f for f in flags if f.source != "static"], policy).reason


def _applicable_stop(record: Mapping[str, Any], profile: Profile) -> dict[str, Any] | None:
    evidence = PROFILES[EVIDENCE_PROFILE]
    for stop in record.get("stops") or []:
        if stop.get("rule") == F.STRICTER_TOLERANCE and profile.tolerances == evidence.stricter_tolerances:
            return stop
        if stop.get("rule") == F.BEYOND_DISTRIBUTION and profile.extra_trials > 0 and profile.beyond_distribution_decides:
            return stop
    return None


def judge_profile(record: Mapping[str, Any], profile_name: str, policy: str | Policy = "") -> Derived:
    """The verdict on an evidence record of a run measured under the profile and judged by the policy's static
    preset and guards (empty: the profile's policy; steps 1-6 of the module docstring)."""
    profile, rules = resolve_judging(profile_name, policy)
    derivable_profile(profile)
    status = str(record.get("status"))
    flags = _flags(record)
    static = static_rejection(flags, rules)
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
        rejecting = runtime_rejection([f for f in flags if f.rule in seen], rules)
        if rejecting is not None:
            return Derived(Status.HACK_DETECTED.value, reason=rejecting.rule)
        return Derived(Status.INCORRECT.value, reason=str(stop["rule"]))
    if status in _CRASHES:
        if str(record.get("reached", "")).startswith("extra trials") and profile.extra_trials == 0:
            return Derived(UNDECIDED, reason=f"{status} in the extra trials, which {profile.name} does not run")
        return Derived(status, reason=status)
    rejecting = runtime_rejection(flags, rules)
    if status == Status.HACK_DETECTED.value:
        return Derived(status, reason=rejecting.rule if rejecting is not None else "hack_detected")
    if rejecting is not None:
        return Derived(Status.HACK_DETECTED.value, reason=rejecting.rule)
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
    derived = judge_profile(record, view.profile, view.policy)
    rules = resolve_judging(view.profile, view.policy)[1]
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
           "judge", "judge_all", "judge_profile", "runtime_rejection", "static_rejection"]
