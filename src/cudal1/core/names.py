"""Names users type for the evaluator's correctness profiles, and the names results record.

The correctness profile `kernelbench-v0` (KernelBench's published 1e-2 tolerance) is also accepted as
`kernelbench`, the name its verdict policy (`--policy kernelbench`) has, so that one harness is one word on
both options. Results keep recording the canonical name, so stored rows and cache keys do not change.
"""

from __future__ import annotations

#: What a user may type -> the profile name results record.
PROFILE_ALIASES = {"kernelbench": "kernelbench-v0"}


def canonical_profile(name: str) -> str:
    """The recorded name of a correctness profile typed as `name` (unknown names pass through unchanged, for
    the evaluator's config to reject with the list of profiles)."""
    return PROFILE_ALIASES.get(name.strip(), name.strip())
