"""Verdict policies: other harnesses' acceptance rules as data, applied on top of the evaluator's verdict.

The evaluator measures and records evidence (static flags, runtime guards, the kernel class, the profiled
kernels); a policy decides what of that evidence its harness rejects. `cuda-l1` (the default) adds nothing.
See `presets.py` for the rule sets and `apply.py` for how they are decided.
"""

from cudal1.policy.apply import apply_policy
from cudal1.policy.presets import DEFAULT_POLICY, PRESETS, Policy, resolve_policy

__all__ = ["DEFAULT_POLICY", "PRESETS", "Policy", "apply_policy", "resolve_policy"]
