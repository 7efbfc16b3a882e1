"""Static analysis of a candidate source: classify the kernel and flag reward-hacking patterns.

`analyze_source` parses the Python AST and the CUDA/C++ strings the candidate compiles (load_inline/load,
the cudal1 raw-CUDA layer, cupy, or any string holding `__global__`), runs every registered rule
(`rules.py`), and returns a `StaticReport`. It never imports or executes the candidate.

What it covers and what it does not is stated in each rule module's docstring; in short, it sees what is
written, not what is computed at run time. The runtime guards (isolation, input checks, poisoned memory,
device-wide timing) are the backstop: a clean static report is not a verdict of honesty.

Usage:
    report = analyze_source(open("cand.py").read(), reference_source=open("ref.py").read())
    print(format_report(report)); bad = rejecting_flags(report, "strict")
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cudal1.analysis._base import dedupe, flag
from cudal1.analysis.classify import classify_kernel, launch_info
from cudal1.analysis.context import build_context
from cudal1.analysis.presets import preset_name, rejecting_flags, resolve_preset
from cudal1.analysis.rules import RULES
from cudal1.core.types import Flag, KernelClass

__all__ = ["StaticReport", "analyze_source", "describe_flag", "format_report", "rejection_message"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StaticReport:
    """The outcome of static analysis of one candidate."""

    kernel_class: KernelClass
    flags: list[Flag] = field(default_factory=list)
    kernels_defined: list[str] = field(default_factory=list)  # __global__ names in compiled sources
    kernels_launched: list[str] = field(default_factory=list)  # of those, launched from the forward path
    preset: str = "strict"
    triton_kernels_defined: list[str] = field(default_factory=list)
    triton_kernels_launched: list[str] = field(default_factory=list)
    extension_functions: list[str] = field(default_factory=list)  # functions exported by load_inline

    @property
    def rejected(self) -> list[Flag]:
        """Flags that reject under this report's preset (only for named presets)."""
        return rejecting_flags(self, self.preset) if not self.preset.startswith("custom") else []

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel_class": self.kernel_class.value,
            "flags": [f.to_dict() for f in self.flags],
            "kernels_defined": list(self.kernels_defined),
            "kernels_launched": list(self.kernels_launched),
            "preset": self.preset,
            "triton_kernels_defined": list(self.triton_kernels_defined),
            "triton_kernels_launched": list(self.triton_kernels_launched),
            "extension_functions": list(self.extension_functions),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StaticReport:
        return cls(
            kernel_class=KernelClass(d["kernel_class"]),
            flags=[Flag.from_dict(f) for f in d["flags"]],
            kernels_defined=list(d.get("kernels_defined", [])),
            kernels_launched=list(d.get("kernels_launched", [])),
            preset=d.get("preset", "strict"),
            triton_kernels_defined=list(d.get("triton_kernels_defined", [])),
            triton_kernels_launched=list(d.get("triton_kernels_launched", [])),
            extension_functions=list(d.get("extension_functions", [])),
        )


def analyze_source(
    source: str, reference_source: str | None = None, preset: str | Mapping[str, str] = "strict"
) -> StaticReport:
    """Analyse a candidate source without executing it.

    `reference_source` enables the comparisons with the reference (sizes, get_inputs, precision);
    `preset` names a preset of `presets.PRESETS` or is an override mapping; rules it turns "off" are
    dropped from the report. A source that does not parse gives a `syntax_error` flag and no other.
    """
    table = resolve_preset(preset)
    name = preset_name(preset)
    try:
        ctx = build_context(source, reference_source)
    except SyntaxError as exc:
        msg = f"{exc.msg} at line {exc.lineno}" if exc.lineno else str(exc.msg)
        return StaticReport(
            kernel_class=KernelClass.PYTORCH_ONLY,
            preset=name,
            flags=[flag("syntax_error", f"cannot parse: {msg}", exc.lineno)],
        )
    flags: list[Flag] = []
    for rule in RULES.values():
        try:
            flags.extend(rule.check(ctx))
        except Exception:  # a bug in one rule must not take the evaluator down; the others still run
            logger.exception("static rule %s failed", rule.name)
    global_flags = any(f.rule in ("global_backend_flags", "algorithm_flags") for f in flags)
    kernel_class = classify_kernel(ctx, global_flags)
    info = launch_info(ctx)
    kept = dedupe([f for f in flags if table.get(f.rule, "flag") != "off"])
    return StaticReport(
        kernel_class=kernel_class,
        flags=kept,
        kernels_defined=list(info.kernels_defined),
        kernels_launched=list(info.kernels_launched),
        preset=name,
        triton_kernels_defined=list(info.triton_defined),
        triton_kernels_launched=list(info.triton_launched),
        extension_functions=sorted(set(info.functions_exported)),
    )


def describe_flag(f: Flag) -> str:
    """`rule: evidence (line N)`: the one line the evaluator puts in a HACK_DETECTED message."""
    where = f" (line {f.line})" if f.line else ""
    return f"{f.rule}: {f.message}{where}"


def rejection_message(report: StaticReport, preset: str | Mapping[str, str] | None = None) -> str:
    """One line naming the first rejecting flag (and how many more), or "" when nothing rejects."""
    bad = rejecting_flags(report, preset if preset is not None else report.preset)
    if not bad:
        return ""
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return describe_flag(bad[0]) + more


def format_report(report: StaticReport) -> str:
    """Plain-text report: a header, then one line per flag `SEVERITY rule (line N): message`."""
    lines = [f"kernel class: {report.kernel_class.value}   preset: {report.preset}"]
    if report.kernels_defined or report.triton_kernels_defined:
        launched = set(report.kernels_launched) | set(report.triton_kernels_launched)
        names = [
            k + ("" if k in launched else " (not launched)")
            for k in report.kernels_defined + report.triton_kernels_defined
        ]
        lines.append("kernels: " + ", ".join(names))
    try:
        rejecting = {id(f) for f in rejecting_flags(report, report.preset)}
    except Exception:  # custom preset names cannot be resolved again; show no reject marks
        rejecting = set()
    for f in report.flags:
        where = f" (line {f.line})" if f.line else ""
        mark = "  [rejects]" if id(f) in rejecting else ""
        lines.append(f"{f.severity.value.upper()} {f.rule}{where}: {f.message}{mark}")
    if not report.flags:
        lines.append("no findings")
    return "\n".join(lines)
