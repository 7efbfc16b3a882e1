"""Static-check presets as data: rule -> "reject" | "flag" | "off".

- `strict` (default): rejects everything that is cheating or almost only used to cheat, including
  precision downcasts (under strict fp32 tolerance a downcast is a way to fake speed) and reading the
  reference; flags the rest.
- `cuda-l1`: CUDA-L1's own acceptance after their fix: only side streams and result caching reject.
  Conservative reading of the paper (it names streams and caching explicitly); everything else is flagged.
- `kernelbench-v0`: KernelBench's original harness had no static checks: nothing rejects, all is flagged.

Users override with a mapping: `{"base": "strict", "precision_downcast": "flag"}` (base defaults to strict).
The report records which preset ran (`StaticReport.preset`).
"""

from __future__ import annotations

from collections.abc import Mapping

from cudal1.analysis.rules import AUXILIARY_RULES, RULES
from cudal1.core.errors import ConfigError
from cudal1.core.names import PRESET_ALIASES, describe_choices
from cudal1.core.types import Flag

__all__ = ["ACTIONS", "PRESETS", "PRESET_HELP", "preset_choices", "preset_name", "rejecting_flags",
           "resolve_preset"]

ACTIONS = ("reject", "flag", "off")
ALL_RULES = (*RULES, *AUXILIARY_RULES)

_STRICT_REJECT = (
    "extra_cuda_stream",
    "threads_or_processes",
    "timer_patching",
    "global_backend_flags",
    "result_caching",
    "lazy_tensor",
    "input_mutation",
    "size_constants_redefined",
    "tampering",
    "precision_downcast",
    "reads_reference",
)

PRESETS: dict[str, dict[str, str]] = {
    "strict": {r: ("reject" if r in _STRICT_REJECT else "flag") for r in ALL_RULES},
    "cuda-l1": {r: ("reject" if r in ("extra_cuda_stream", "result_caching") else "flag") for r in ALL_RULES},
    "kernelbench-v0": {r: "flag" for r in ALL_RULES},
}

#: One line per preset for help texts (the entries above are plain rule tables, with no room for one).
PRESET_HELP: dict[str, str] = {
    "strict": "rejects cheats, downcasts included",
    "cuda-l1": "only side streams and result caching reject",
    "kernelbench-v0": "nothing rejects, all is flagged",
}


def preset_choices() -> str:
    """The presets with their descriptions, under the names the command line accepts, for help texts."""
    return describe_choices(((name, PRESET_HELP.get(name, "")) for name in PRESETS), aliases=PRESET_ALIASES)


def resolve_preset(preset: str | Mapping[str, str]) -> dict[str, str]:
    """The full rule -> action mapping for a preset name or an override mapping (see module docstring)."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ConfigError(f"unknown static preset {preset!r}; choose one of {', '.join(PRESETS)}")
        return dict(PRESETS[preset])
    base = preset.get("base", "strict")
    table = resolve_preset(base)
    for rule, action in preset.items():
        if rule == "base":
            continue
        if rule not in table:
            raise ConfigError(f"unknown static rule {rule!r} in preset override; known: {', '.join(table)}")
        if action not in ACTIONS:
            raise ConfigError(f"action for {rule!r} must be one of {ACTIONS}, not {action!r}")
        table[rule] = action
    return table


def preset_name(preset: str | Mapping[str, str]) -> str:
    """A short name to record: the preset's own, or `custom(base=...)` for an override mapping."""
    return preset if isinstance(preset, str) else f"custom(base={preset.get('base', 'strict')})"


def rejecting_flags(flags_or_report, preset: str | Mapping[str, str] = "strict") -> list[Flag]:
    """The flags that reject the candidate under `preset` (a StaticReport or a list of flags).

    Syntax errors never reject here: the evaluator reports them as compile errors.
    """
    table = resolve_preset(preset)
    flags = getattr(flags_or_report, "flags", flags_or_report)
    return [f for f in flags if f.source == "static" and table.get(f.rule) == "reject"]
