"""Static analysis of candidate kernels: classification (custom CUDA / Triton / PyTorch-only / flags-only)
and named reward-hacking rules, with presets that decide which findings reject a candidate.

Entry points: `analyze_source`, `format_report`, `rejecting_flags`, `rejection_message`.
"""

from cudal1.analysis.presets import PRESETS, rejecting_flags, resolve_preset
from cudal1.analysis.rules import RULES
from cudal1.analysis.rules_state import names_used_by_modelnew
from cudal1.analysis.static import (
    StaticReport,
    analyze_source,
    describe_flag,
    format_report,
    rejection_message,
)

__all__ = [
    "PRESETS",
    "RULES",
    "StaticReport",
    "analyze_source",
    "describe_flag",
    "format_report",
    "names_used_by_modelnew",
    "rejecting_flags",
    "rejection_message",
    "resolve_preset",
]
