"""The static stage: analyse the candidate's source as text, before anything of it runs.

A cheap first filter and the kernel classifier (`cudal1.analysis`): rules that reject under the profile's
preset end the evaluation at once with `hack_detected`; everything else travels with the result as flags.
No guarantee rests on it: names can be disguised, which is why the runtime checks exist.
"""

from __future__ import annotations

from typing import Any

from cudal1.analysis import StaticReport, analyze_source, names_used_by_modelnew, rejection_message
from cudal1.core.syntax import parse as parse_python


def static_report(source: str, reference: str | None, preset: str) -> StaticReport:
    """The static analysis report of a candidate against its reference."""
    return analyze_source(source, reference_source=reference, preset=preset)


def static_rejection(report: StaticReport, preset: str) -> str:
    """One line naming the first rejecting rule, or "" when the candidate may run."""
    return rejection_message(report, preset)


def changed_constants_used(source: str, candidate: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """Module constants whose values (as the candidate's runner read them after import) differ from the
    reference's and that ModelNew reads: the only redefinitions that can change what it computes."""

    try:
        used = names_used_by_modelnew(parse_python(source))
    except SyntaxError:
        return []
    return sorted(n for n, v in candidate.items() if n in reference and reference[n] != v and n in used)
