"""The one rule that turns an evaluation's flags into a verdict's rejection under a policy.

    from cudal1.policy.decide import decide
    decision = decide(result.flags, resolve_policy("guarded"))
    decision.rejects, decision.rejected, decision.rows    # one row per flag: its severity, what rejected it

Every flag is judged by exactly one of these rules, named in its row (`Finding.rejected_by`):
- a static flag (`source == "static"`): the policy's static preset, where that preset's action is `reject`;
- a `policy.*` flag: the policy's harness rule that raised it (`apply.violations_from_facts`);
- a runtime finding of severity ERROR that `cudal1.core.flags.RUNTIME_FLAGS` marks `always_rejects`: every
  policy (it makes the measured speedup meaningless);
- the steps after an evaluation (`source` "judge": the LLM judge with `reject_on_cheat`; `recheck.*`: the
  re-check on a second GPU) reject with severity ERROR under every policy, as they did when they ran;
- any other runtime finding of severity ERROR: the policy's `reject_runtime_guards`.
Anything else is recorded only. The evaluator (`cudal1.eval.evaluation`), the audit's views
(`cudal1.audit.views`), re-judging a stored result (`rejudge`) and `cudal1 explain` all read this rule.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cudal1.analysis.presets import resolve_preset
from cudal1.core import flags as F
from cudal1.core.types import EvalResult, Flag, Severity, Status
from cudal1.policy.presets import Policy, resolve_policy

EVERY_POLICY = "every policy (RUNTIME_FLAGS: always_rejects)"
RUNTIME_GUARDS = "reject_runtime_guards"


@dataclass(frozen=True)
class Finding:
    """One flag as the policy judged it: `rejected_by` names the policy rule that rejects it ("" : recorded)."""

    flag: Flag
    rejected_by: str = ""

    @property
    def rejects(self) -> bool:
        return bool(self.rejected_by)

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.flag.rule, "severity": self.flag.severity.value, "source": self.flag.source,
                "rejected_by": self.rejected_by, "message": self.flag.message}


@dataclass(frozen=True)
class Decision:
    """Every flag of an evaluation judged under one policy."""

    policy: str
    rows: tuple[Finding, ...]

    @property
    def rejected(self) -> list[Flag]:
        """The rejecting flags, in the order they were raised."""
        return [row.flag for row in self.rows if row.rejects]

    @property
    def rejects(self) -> bool:
        return any(row.rejects for row in self.rows)

    @property
    def reason(self) -> Flag | None:
        """The flag that names the rejection: one that rejects under every policy first, else the first."""
        first = [row for row in self.rows if row.rejects]
        everywhere = [row for row in first if row.rejected_by == EVERY_POLICY]
        return (everywhere or first)[0].flag if first else None


def rejected_by(flag: Flag, policy: Policy, static_table: dict[str, str] | None = None) -> str:
    """The policy rule that rejects `flag`, or "" when it is only recorded (the module docstring's rule)."""
    if flag.source == "static":
        table = static_table if static_table is not None else resolve_preset(policy.static_preset)
        return f"static preset {policy.static_preset}" if table.get(flag.rule) == "reject" else ""
    if flag.rule.startswith("policy."):
        return f"policy {policy.name}: {flag.rule.removeprefix('policy.')}"
    if flag.severity is not Severity.ERROR:
        return ""
    if F.always_rejects(flag.rule):
        return EVERY_POLICY
    if flag.source == "judge" or flag.rule.startswith("recheck."):
        return "the LLM judge (reject_on_cheat)" if flag.source == "judge" else "the re-check on a second GPU"
    return f"{RUNTIME_GUARDS} ({policy.name})" if policy.reject_runtime_guards else ""


def decide(flags: Iterable[Flag], policy: Policy | str | None) -> Decision:
    """Every flag judged under `policy` (a Policy, a preset's name or a file)."""
    rules = resolve_policy(policy)
    table = resolve_preset(rules.static_preset)
    return Decision(rules.name, tuple(Finding(f, rejected_by(f, rules, table)) for f in flags))


def rejudge(result: EvalResult, policy: Policy | str | None, source: str | None = None, *,
            task_source: str | None = None) -> EvalResult:
    """A stored result judged again under another policy, without running anything.

    The verdicts the flags decide are re-decided: `correct`, `incorrect` and `hack_detected` become
    `hack_detected` where the new policy rejects one of the flags; a `hack_detected` the new policy does not
    reject becomes `incorrect` when a wrong output was recorded, else `infra_error`: the recorded policy
    stopped the evaluation (or dropped its timing), so only evaluating it again decides; a record that stops
    nothing (`kernelbench-v0`, the `evidence` profile) can be re-judged under every policy. Harness rules are
    decided from `source` when it is given (`apply.apply_policy`). The result records the new policy."""
    from cudal1.policy.apply import apply_policy, recorded_policy

    rules = resolve_policy(policy)
    protocol = {**result.protocol, **recorded_policy(rules)}
    flags = [f for f in result.flags if not f.rule.startswith("policy.")]  # the old policy's own verdicts go
    if result.status not in (Status.CORRECT, Status.INCORRECT, Status.HACK_DETECTED):
        return result.replace(protocol=protocol, flags=flags)
    decision = decide(flags, rules)
    if decision.rejects:
        message = "; ".join(f"{f.rule}: {f.message}" for f in decision.rejected[:3])
        return result.replace(status=Status.HACK_DETECTED, message=message, flags=flags, speedup=None,
                              timing=None, protocol=protocol)
    if result.status is Status.HACK_DETECTED:
        if result.mismatch is None:
            return result.replace(status=Status.INFRA_ERROR, flags=flags, protocol=protocol,
                                  message=f"not decidable from the record under {rules.name}: the recorded "
                                          "policy stopped the evaluation; evaluate it again")
        result = result.replace(status=Status.INCORRECT, message="wrong output (recorded before the rejection)")
    out = result.replace(flags=flags, protocol=protocol)
    return apply_policy(out, source, rules, task_source=task_source) if source is not None else out


__all__ = ["EVERY_POLICY", "RUNTIME_GUARDS", "Decision", "Finding", "decide", "rejected_by", "rejudge"]
