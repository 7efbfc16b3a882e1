"""Names users type, the names results record, and the lists of choices that help texts build from the
tables.

A profile names how to measure and a policy what rejects (`cudal1.eval.config.resolve_judging`). The old
profile spellings `cuda-l1`, `kernelbench-v0` and `kernelbench` named a measurement and a set of rejection
rules at once; they are still accepted (`RENAMED_PROFILES`: the profile and the policy each stands for), with
a one-line deprecation warning. The static preset `kernelbench-v0` is also typed `kernelbench`
(`PRESET_ALIASES`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: What a user may type for a static preset -> the preset's name.
PRESET_ALIASES = {"kernelbench": "kernelbench-v0"}

#: Old profile spellings -> (the profile, the policy) each stands for now.
RENAMED_PROFILES: dict[str, tuple[str, str]] = {
    "cuda-l1": ("loose", "cuda-l1"),
    "kernelbench-v0": ("loose", "kernelbench-v0"),
    "kernelbench": ("loose", "kernelbench-v0"),
}


def canonical_preset(name: str) -> str:
    """The name of a static preset typed as `name` (unknown names pass through, for the caller to reject)."""
    return PRESET_ALIASES.get(name.strip(), name.strip())


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
