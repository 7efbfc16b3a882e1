"""The registry of static rules: name -> check function, default severity, one-line summary.

Every rule is `check_<exploit>(ctx) -> list[Flag]`; the rationale of each sits above its severity in
`_base.DEFAULT_SEVERITY` and above its pattern constants in its module. Add a rule by writing the function,
giving it a severity and a preset action in `presets.py`, and a fixture in `tests/fixtures/candidates/`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cudal1.analysis import rules_runtime as rt
from cudal1.analysis import rules_state as st
from cudal1.analysis import rules_values as va
from cudal1.analysis._base import DEFAULT_SEVERITY
from cudal1.analysis.context import AnalysisContext
from cudal1.core.types import Flag, Severity

__all__ = ["RULES", "Rule"]


@dataclass(frozen=True)
class Rule:
    """One registered static rule."""

    name: str
    check: Callable[[AnalysisContext], list[Flag]]
    severity: Severity
    summary: str


def _rule(name: str, check: Callable[[AnalysisContext], list[Flag]], summary: str) -> Rule:
    return Rule(name=name, check=check, severity=DEFAULT_SEVERITY[name], summary=summary)


# Order is the order flags of equal line are reported in; most damning first.
RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        _rule(
            "extra_cuda_stream",
            rt.check_extra_cuda_stream,
            "work on a CUDA stream other than the current one",
        ),
        _rule("threads_or_processes", rt.check_threads_or_processes, "threads, processes or async work"),
        _rule(
            "timer_patching",
            rt.check_timer_patching,
            "monkey-patched timers, events, synchronize, comparisons",
        ),
        _rule("global_backend_flags", rt.check_global_backend_flags,
              "global switches that can change precision (TF32, matmul precision, dtype)"),
        _rule("algorithm_flags", rt.check_algorithm_flags,
              "global algorithm switches that keep fp32 (cuDNN benchmark, determinism, threads)"),
        _rule("tampering", rt.check_tampering, "sys.modules, frame walking, gc scans, exec/eval"),
        _rule("result_caching", st.check_result_caching, "outputs memoized across calls"),
        _rule("lazy_tensor", va.check_lazy_tensor, "tensor subclasses or non-tensor outputs"),
        _rule("input_mutation", va.check_input_mutation, "in-place writes to the inputs"),
        _rule("size_constants_redefined", st.check_size_constants_redefined, "sizes or get_inputs redefined"),
        _rule("reads_reference", st.check_reads_reference, "uses the reference Model, inputs or module"),
        _rule("reference_reuse", st.check_reference_reuse, "ModelNew is the reference (re-exported or inherited)"),
        _rule("precision_downcast", va.check_precision_downcast, "fp16/bf16/TF32 for an fp32 task"),
        _rule("exception_fallback", st.check_exception_fallback, "try/except fallbacks, swallowed errors"),
        _rule("unused_kernel", st.check_unused_kernel, "decoy kernels never launched from forward"),
        _rule("unbuildable_extension", st.check_unbuildable_extension, "load_inline that can never build"),
        _rule(
            "inner_compile_or_graph", rt.check_inner_compile_or_graph, "torch.compile / CUDA graphs inside"
        ),
        _rule("stale_memory", va.check_stale_memory, "uninitialised outputs (runtime poisoning decides)"),
        _rule("constant_output", va.check_constant_output, "outputs that ignore the inputs"),
        _rule("env_or_io", rt.check_env_or_io, "environment writes, file/network I/O, native code"),
    )
}
# Emitted by extra_cuda_stream's launch scan and for joined side streams, by size_constants_redefined for redefinitions that cannot change
# what ModelNew computes (KernelBench boilerplate, or a value only the run can tell), and by analyze_source
# itself; listed so presets can name them.
AUXILIARY_RULES = ("unverified_launch_stream", "joined_cuda_stream", "size_constants_ignored", "syntax_error")
