"""Why a verdict: one result's flags under its policy (`explain_verdict`, `cudal1 explain RESULT`), and which
protocol change explains a changed verdict between two audits of the same release (`explain_changes`).

    from cudal1.audit.explain import explain_verdict, format_verdict
    print(format_verdict(explain_verdict(result)))          # the recorded policy; policy="..." re-judges

    from cudal1.audit.explain import explain_changes
    explained = explain_changes(load_audit("docs/audit/cuda-l1-h100-h200"), load_audit("new/h100"))

`PROTOCOL_CHANGES` is a table: each change since protocol 3 (the evaluator's `PROTOCOL_VERSION` history, and
the static rules that changed with it) with the verdict transitions it can cause and the flag rules through
which it acts. A changed verdict is explained by every change whose transition it is and whose rules appear
among the flags of either side (a change that names no rule explains its transition on its own, and is
listed only when no change with rules does). What no change explains is reported as unexplained, with the
flags added and removed between the two sides as evidence.

Limits: an audit.json keeps each task's verdict and flag names, not the evidence behind a mismatch, so a
change that acts through a tolerance (the small-output rule of protocol 4) is matched by its transition alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cudal1.audit.compare import _main_rows
from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Status
from cudal1.eval.config import PROFILE_POLICIES, canonical_options
from cudal1.policy import Policy, decide, rejudge, resolve_policy

C, I, H, E, R, T, X = "correct", "incorrect", "hack_detected", "compile_error", "runtime_error", "timeout", "infra_error"  # noqa: E741 - the statuses, by initial


@dataclass(frozen=True)
class ProtocolChange:
    """One change of the evaluator: what it is, the verdict transitions it can cause, the rules it acts by."""

    name: str
    transitions: frozenset[tuple[str, str]]
    rules: tuple[str, ...] = ()
    new_rules_only: bool = False  # the rules must appear on the new side (a new finding), not the earlier

    def explains(self, earlier: str, new: str, earlier_flags: set[str], new_flags: set[str]) -> bool:
        if (earlier, new) not in self.transitions:
            return False
        if not self.rules:
            return True
        seen = new_flags if self.new_rules_only else earlier_flags | new_flags
        return any(rule in seen for rule in self.rules)


def _to(earlier: tuple[str, ...], new: tuple[str, ...]) -> frozenset[tuple[str, str]]:
    return frozenset((a, b) for a in earlier for b in new if a != b)


PROTOCOL_CHANGES: tuple[ProtocolChange, ...] = (
    ProtocolChange("p4: the parent's clock bounds the candidate's time (timing.outside_clock, below_floor)",
                   _to((C,), (H,)), ("timing.outside_clock", "timing.below_floor", "timing.capped"), True),
    ProtocolChange("p4: extra trials beyond the reference's distribution (strict)", _to((C,), (I,)),
                   ("runtime.beyond_distribution",), True),
    ProtocolChange("p4: outputs near zero held to the reference's own float32 error, not to zero", _to((I,), (C,))),
    ProtocolChange("p4: inputs refilled, verified timed outputs", _to((C,), (I,)), ("runtime.timed_output",), True),
    ProtocolChange("p6: reduced precision read from the run (guard.reduced_precision)", _to((C,), (H,)),
                   ("guard.reduced_precision",), True),
    ProtocolChange("p10: a failed build the candidate's own code catches is judged for what runs",
                   _to((E,), (C, I, H, R, T)), ("runtime.custom_build_failed",), True),
    ProtocolChange("p10: switches that keep float32 (cuDNN benchmark, determinism, threads) are reported, not "
                   "rejected", _to((H,), (C, I, R, T)), ("algorithm_flags", "guard.algorithm_flags")),
    ProtocolChange("p10: a reference that fails in its own runner is not the candidate's failure",
                   _to((C, I, H, E, R, T), (X,)), ("reference_error",), True),
    ProtocolChange("p11: a report the parent's brackets contradict counts up to the bound, or rejects",
                   _to((C,), (H,)), ("timing.capped", "timing.outside_clock"), True),
    ProtocolChange("p17: the guards name a swapped code object, a shadowed or class-swapped harness method",
                   _to((C,), (H,)), ("guard.timer_patching",), True),
    ProtocolChange("p17: work left on the device must exceed a tenth of the call to reject (interference)",
                   _to((H,), (C,)), ("timing.interference",)),
    ProtocolChange("static rules since protocol 3: redefined sizes judged by their effect on ModelNew",
                   _to((H,), (C, I, R, T)), ("size_constants_redefined", "size_constants_ignored")),
    ProtocolChange("static rules since protocol 3: a side stream joined back to the current one is reported "
                   "(joined_cuda_stream), not rejected", _to((H,), (C, I, R, T)), ("joined_cuda_stream",), True),
    ProtocolChange("the evidence pass: strict read from one record that ran on, so a guard first raised after "
                   "strict would have stopped counts", _to((I,), (H,)),
                   ("guard.global_state", "guard.threads", "guard.native_threads", "guard.global_hooks",
                    "guard.function_mode", "guard.trace_hook", "guard.signal_handlers", "guard.timer_patching"),
                   True),
    ProtocolChange("another card or limits: a time limit, a memory limit or a crash that depends on the machine",
                   _to((C, I, R, T), (R, T)) | _to((R, T), (C, I))),
)


def _flags(row: Mapping[str, Any]) -> set[str]:
    return {str(f) for f in row.get("flags") or []}


def explain_changes(earlier: Mapping[str, Any], new: Mapping[str, Any],
                    changes: tuple[ProtocolChange, ...] = PROTOCOL_CHANGES) -> dict[str, Any]:
    """Every verdict that differs between two audit reports' own runs on their shared tasks, with the names of
    the changes that explain it, and per change how many it explains (module docstring)."""
    a_rows, b_rows = _main_rows(earlier, "earlier"), _main_rows(new, "new")
    out, by_change = [], {}
    for task in sorted(set(a_rows) & set(b_rows)):
        a, b = str(a_rows[task].get("status")), str(b_rows[task].get("status"))
        if a == b:
            continue
        fa, fb = _flags(a_rows[task]), _flags(b_rows[task])
        found = [c for c in changes if c.explains(a, b, fa, fb)]
        with_rules = [c for c in found if c.rules]
        names = [c.name for c in (with_rules or found)]
        for name in names:
            by_change[name] = by_change.get(name, 0) + 1
        evidence = ", ".join([f"+{r}" for r in sorted(fb - fa)] + [f"-{r}" for r in sorted(fa - fb)]) or "same flags"
        out.append({"task_id": task, "earlier": a, "new": b, "changes": names, "evidence": evidence})
    unexplained = sum(not e["changes"] for e in out)
    if unexplained:
        by_change["unexplained"] = unexplained
    return {"changes": out, "by_change": dict(sorted(by_change.items(), key=lambda kv: (-kv[1], kv[0])))}


def recorded_judging(result: EvalResult) -> tuple[str, str]:
    """(profile, policy) a result records. A row from before policies held the static preset and the guards
    (no `policy_rules`) was judged for its static flags and guards by its profile: its profile's policy
    (`PROFILE_POLICIES`, old spellings mapped) stands for it (a harness policy's `policy.*` flags it
    carries are shown as that policy's)."""
    profile, name = result.profile, result.policy
    try:
        canonical, implied = canonical_options(profile, None) if profile else ("", "")
    except ConfigError:
        return profile, name
    if "policy_rules" not in result.protocol and canonical:
        name = str(implied or PROFILE_POLICIES.get(canonical, name))
    return canonical, name


def explain_verdict(result: EvalResult, policy: str | Policy | None = None) -> dict[str, Any]:
    """Why `result` has its verdict: every flag with its severity and the policy rule that rejects it (one
    table, `cudal1.policy.decide`), and the rule that decided. With `policy`, the result is re-judged under it
    from its record, nothing run again (`cudal1.policy.rejudge`)."""
    profile, recorded = recorded_judging(result)
    if policy is not None and policy != "":
        rules = resolve_policy(policy)
        judged = rejudge(result, rules)
    else:
        try:
            rules = resolve_policy(recorded or None)
        except ConfigError:
            raise ConfigError(f"the result records policy {recorded!r}, which is not a preset: name its policy "
                              "file to judge it") from None
        judged = result
    decision = decide(judged.flags, rules)
    if judged.status is Status.HACK_DETECTED:
        reason = decision.reason
        row = next((r for r in decision.rows if reason is not None and r.flag is reason), None)
        decided_by = f"{reason.rule}: {row.rejected_by}" if reason is not None and row else judged.message
    elif judged.status is Status.CORRECT:
        decided_by = "no flag rejects under this policy"
    else:
        decided_by = f"the measurement: {judged.message}" if judged.message else "the measurement"
    return {"task_id": result.task_id, "status": judged.status.value, "recorded_status": result.status.value,
            "profile": profile, "policy": rules.name, "recorded_policy": recorded, "decided_by": decided_by,
            "flags": [row.to_dict() for row in decision.rows]}


def format_verdict(explained: Mapping[str, Any]) -> str:
    """The explanation as plain text: the verdict, what decided it, one line per flag."""
    head = f"{explained['task_id'] or 'result'}: {explained['status']} (profile {explained['profile'] or '?'}, " \
           f"policy {explained['policy']})"
    if explained["status"] != explained["recorded_status"] or explained["policy"] != explained["recorded_policy"]:
        head += f"; recorded: {explained['recorded_status']} under {explained['recorded_policy'] or '?'}"
    lines = [head, f"decided by: {explained['decided_by']}"]
    rows = explained["flags"]
    if rows:
        width = max(len(r["rule"]) for r in rows)
        lines.append(f"{'flag'.ljust(width)}  severity  source   rejected by")
        for r in rows:
            lines.append(f"{r['rule'].ljust(width)}  {r['severity'].ljust(8)}  {r['source'].ljust(7)}  "
                         f"{r['rejected_by'] or '- (recorded)'}")
    else:
        lines.append("no flags")
    return "\n".join(lines)


__all__ = ["PROTOCOL_CHANGES", "ProtocolChange", "explain_changes", "explain_verdict", "format_verdict",
           "recorded_judging"]
