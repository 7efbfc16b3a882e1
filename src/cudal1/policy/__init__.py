"""Verdict policies: what rejects, as data, decided from recorded evidence.

The evaluator measures and records evidence (static flags, runtime guards, the kernel class, the profiled
kernels) under a correctness profile (how to measure); a policy decides what of that evidence rejects: its
static preset, whether runtime guards reject, its harness's rules. See `presets.py` for the rule sets,
`decide.py` for the one rule that judges flags and `apply.py` for the harness rules.
"""

from cudal1.policy.apply import apply_policy
from cudal1.policy.decide import Decision, decide, rejudge
from cudal1.policy.presets import DEFAULT_POLICY, PRESETS, Policy, resolve_policy

__all__ = ["DEFAULT_POLICY", "PRESETS", "Decision", "Policy", "apply_policy", "decide", "rejudge",
           "resolve_policy"]
