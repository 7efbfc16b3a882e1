"""Shared pieces of the static rules: the severity table (with the rationale of each rule) and helpers.

Each rule is a `check_<exploit>(ctx) -> list[Flag]` in one of the `rules_*` modules; `rules.py` registers
them. Severity says how bad a finding is; whether it *rejects* a candidate is the preset's decision
(`presets.py`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from cudal1.analysis.context import AnalysisContext
from cudal1.core.types import Flag, Severity

E, W = Severity.ERROR, Severity.WARNING

# Default severity of every rule.
DEFAULT_SEVERITY: dict[str, Severity] = {
    # Rationale: work on a side stream is invisible to events recorded on the current stream (82 of 250
    # CUDA-L1 outputs did this: a fake 18x). An honest kernel has no reason to leave the current stream.
    "extra_cuda_stream": E,
    # Rationale: a side stream that the current stream waits on before forward returns: its work is inside
    # the measured span (SOL-ExecBench accepts and times it); descriptive only.
    "joined_cuda_stream": Severity.INFO,
    # Rationale: a launch on a stream we cannot prove is the current one; suspicious, not proof.
    "unverified_launch_stream": W,
    # Rationale: a worker thread/process returns before the work is done, hiding it from the timer.
    "threads_or_processes": E,
    # Rationale: patched timers, events, synchronize or comparison functions fake the measurement.
    "timer_patching": E,
    # Rationale: global switches that can change precision (TF32, reduced-precision reductions, matmul
    # precision, default dtype): a way to trade accuracy for speed that a tolerance may not see.
    "global_backend_flags": E,
    # Rationale: algorithm switches that keep fp32 (cuDNN benchmark, determinism, threads) reach only the
    # candidate's own process; a legitimate optimisation, reported so that a reader sees where speed came from.
    "algorithm_flags": W,
    # Rationale: fp16/bf16/TF32 speeds an fp32 task up by giving up accuracy; cheating under strict tolerance.
    "precision_downcast": W,
    # Rationale: outputs memoized across calls (keyed on data_ptr, or the first result) skip the work.
    "result_caching": E,
    # Rationale: try/except around the kernel that falls back to torch hides a kernel that never works.
    "exception_fallback": W,
    # Rationale: a candidate that shrinks the sizes or get_inputs is timed on a smaller problem.
    "size_constants_redefined": E,
    # Rationale: a redefinition ModelNew does not read, or KernelBench's own get_inputs: the harness ignores
    # them (it takes inputs and sizes from the reference); descriptive only.
    "size_constants_ignored": Severity.INFO,
    # Rationale: ModelNew that is the reference itself earns ~1.0x: not a cheat, but no optimization either.
    "reference_reuse": W,
    # Rationale: a compiled kernel the forward never launches is a decoy (looks custom, runs torch).
    "unused_kernel": W,
    # Rationale: load_inline(functions=[...]) with empty cpp_sources can never build (main.cpp declares
    # nothing); with a fallback the candidate runs PyTorch. A build problem, not a cheat: it only warns.
    "unbuildable_extension": W,
    # Rationale: torch.compile / CUDA graphs inside a candidate are baselines, not custom kernels.
    "inner_compile_or_graph": W,
    # Rationale: tensor subclasses or non-tensor outputs defer the work until the result is compared.
    "lazy_tensor": E,
    # Rationale: in-place writes to inputs corrupt what the reference sees when it runs afterwards.
    "input_mutation": E,
    # Rationale: uninitialised outputs may hold the reference's freed result (the Sakana "150x" case);
    # honest kernels that write every element do this too, so runtime poisoning decides.
    "stale_memory": W,
    # Rationale: outputs that do not depend on the inputs pass only through a loose absolute tolerance.
    "constant_output": W,
    # Rationale: reading the reference Model, its inputs or its module gives access to its outputs.
    "reads_reference": E,
    # Rationale: environment writes, file or network I/O and native calls are odd in a kernel; honest
    # candidates do set e.g. TORCH_CUDA_ARCH_LIST, so this only warns.
    "env_or_io": W,
    # Rationale: sys.modules, frame walking, gc scans and exec/eval reach the harness or hide code.
    "tampering": E,
    # Rationale: descriptive; the source could not be parsed, so nothing else was checked.
    "syntax_error": E,
}

MAX_FLAGS_PER_RULE = 4  # keep the feedback to the LLM short; the first findings are the informative ones


def flag(rule: str, message: str, line: int | None = None, severity: Severity | None = None) -> Flag:
    """Build a static flag with the rule's default severity."""
    return Flag(
        rule=rule, severity=severity or DEFAULT_SEVERITY[rule], message=message, line=line, source="static"
    )


def calls(node: ast.AST) -> Iterator[ast.Call]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            yield sub


def is_self_attr(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def matches(name: str | None, prefixes: tuple[str, ...]) -> bool:
    """True when the dotted `name` equals one of `prefixes` or lies under it."""
    return bool(name) and any(name == p or name.startswith(p + ".") for p in prefixes)


def cuda_ident_flags(
    ctx: AnalysisContext, rule: str, idents: dict[str, str], severity: Severity | None = None
) -> list[Flag]:
    """Flags for CUDA identifiers of `idents` (ident -> message) found in any compiled CUDA string."""
    out: list[Flag] = []
    for cs in ctx.cuda_strings:
        found = cs.info.idents()
        for ident, msg in idents.items():
            if ident in found:
                out.append(
                    flag(rule, f"{msg} (`{ident}` in CUDA source)", cs.py_line_of(found[ident]), severity)
                )
    return out


def forward_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = fn.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    if args.vararg:
        names.append(args.vararg.arg)
    return [n for n in names if n != "self"]


def dedupe(flags: list[Flag]) -> list[Flag]:
    """Drop repeated (rule, line, message) and keep at most MAX_FLAGS_PER_RULE per rule."""
    seen: set[tuple] = set()
    per_rule: dict[str, int] = {}
    out: list[Flag] = []
    for f in sorted(flags, key=lambda f: f.line or 0):
        key = (f.rule, f.line, f.message)
        if key in seen or per_rule.get(f.rule, 0) >= MAX_FLAGS_PER_RULE:
            continue
        seen.add(key)
        per_rule[f.rule] = per_rule.get(f.rule, 0) + 1
        out.append(f)
    return out
