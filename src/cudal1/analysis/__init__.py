"""Static analysis of candidate kernels: classification (custom CUDA / Triton / PyTorch-only / flags-only)
and named reward-hacking rules, with presets that decide which findings reject a candidate.

Entry points: `analyze_source`, `format_report`, `rejecting_flags`, `rejection_message`.

The names below are loaded on first use: a runner's build hooks import `cudal1.analysis.cuda_source` (the
comment stripper) and, through this package, none of the rules.
"""

from __future__ import annotations

from cudal1.core.lazy import lazy_exports

_EXPORTS = {
    "PRESETS": "cudal1.analysis.presets", "rejecting_flags": "cudal1.analysis.presets",
    "resolve_preset": "cudal1.analysis.presets", "RULES": "cudal1.analysis.rules",
    "names_used_by_modelnew": "cudal1.analysis.rules_state", "StaticReport": "cudal1.analysis.static",
    "analyze_source": "cudal1.analysis.static", "describe_flag": "cudal1.analysis.static",
    "format_report": "cudal1.analysis.static", "rejection_message": "cudal1.analysis.static",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
