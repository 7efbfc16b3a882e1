"""Names users type for the evaluator's correctness profiles, the names results record, and the lists of
choices that help texts build from the tables.

The correctness profile `kernelbench-v0` (KernelBench's published 1e-2 tolerance) is also accepted as
`kernelbench`, the name its verdict policy (`--policy kernelbench`) has, so that one harness is one word on
both options. Results keep recording the canonical name, so stored rows and cache keys do not change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: What a user may type -> the profile name results record.
PROFILE_ALIASES = {"kernelbench": "kernelbench-v0"}


def canonical_profile(name: str) -> str:
    """The recorded name of a correctness profile typed as `name` (unknown names pass through unchanged, for
    the evaluator's config to reject with the list of profiles)."""
    return PROFILE_ALIASES.get(name.strip(), name.strip())


def describe_choices(entries: Iterable[tuple[str, str]], *, aliases: Mapping[str, str] | None = None,
                     or_else: str = "") -> str:
    """A help text's list of choices from (name, one-line description) pairs: 'a (what a is), b or c'.

    Help texts are built from the tables themselves (profiles, presets, policies), so that a new entry is
    listed without editing every option that offers it. A name with an alias that users type (`aliases`:
    alias -> name) is shown as the alias, the name following it: 'kernelbench (...; also kernelbench-v0)'.
    `or_else` ends the list with a choice that is not a name (e.g. 'a YAML/JSON file').
    """
    parts = []
    for name, description in entries:
        typed = [alias for alias, target in (aliases or {}).items() if target == name]
        notes = [description] if description else []
        if typed:
            notes.append(f"also {name}")
        shown = typed[0] if typed else name
        parts.append(f"{shown} ({'; '.join(notes)})" if notes else shown)
    if or_else:
        parts.append(or_else)
    return ", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else "".join(parts)
