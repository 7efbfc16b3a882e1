"""What the forward path launches, and the kernel class that follows from it.

Classes (design section 4, *Guards*): `custom_cuda` when a `__global__` kernel (or inline PTX) is defined
and launched from the forward path, through load_inline/load, the cudal1 raw-CUDA layer or cupy;
`triton` when a `@triton.jit` kernel is launched from it; `flags_only` when no custom kernel runs and the
candidate changes global backend flags; `pytorch_only` otherwise.

Choice for fallbacks: when every launch site of custom kernels on the forward path sits inside a `try`
whose handler runs something else (torch ops, the reference), the candidate is classified by what is
guaranteed to run, i.e. *not* custom (`pytorch_only` or `flags_only`), and the `exception_fallback` rule
flags it. A decoy (compiled, never launched) is likewise not custom and gets `unused_kernel`, and so are the
kernels of a `load_inline` that can never build (`functions=` with empty `cpp_sources`: torch's main.cpp
cannot declare them), which get `unbuildable_extension`.

Limits: launches are matched by name (an exported function, a kernel name, the variable holding a compiled
module) anywhere on the forward path; a name that is mentioned but not actually called still counts.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from cudal1.analysis.context import AnalysisContext, Extension
from cudal1.core.types import KernelClass

__all__ = ["LaunchInfo", "classify_kernel", "launch_info", "unbuildable"]


@dataclass
class LaunchInfo:
    """Kernels defined and launched, per kind, and whether the launches are only fallback-guarded."""

    kernels_defined: list[str] = field(default_factory=list)
    kernels_launched: list[str] = field(default_factory=list)
    triton_defined: list[str] = field(default_factory=list)
    triton_launched: list[str] = field(default_factory=list)
    functions_exported: list[str] = field(default_factory=list)
    functions_used: list[str] = field(default_factory=list)
    unused_extensions: list[Extension] = field(default_factory=list)
    unbuildable_kernels: list[str] = field(default_factory=list)  # launched through an unbuildable extension
    inline_asm_launched: bool = False
    fallback_only: bool = False  # every launch site is inside a try with a fallback handler
    fallback_lines: list[int] = field(default_factory=list)


def _bound_once_and_never_mutated(name: str, ctx: AnalysisContext) -> bool:
    """`name` has one binding in the whole module (no re-assignment, `+=`, parameter or loop variable of the
    same name anywhere) and no `name.append/extend/insert(...)` call."""
    bindings = 0
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store | ast.Del):
            bindings += 1
        elif isinstance(node, ast.arg) and node.arg == name:
            bindings += 1
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Name) and node.func.value.id == name
              and node.func.attr in ("append", "extend", "insert", "__iadd__")):
            return False
    return bindings == 1


def _certainly_empty(node: ast.AST | None, ctx: AnalysisContext) -> bool:
    """`node` is an empty (or blank) string for sure: a constant, a list of them, or a module-level name
    bound once to one and never changed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return not node.value.strip()
    if isinstance(node, ast.List | ast.Tuple):
        return all(_certainly_empty(e, ctx) for e in node.elts)
    if isinstance(node, ast.Name) and len(ctx.module_assigns.get(node.id, ())) == 1:
        return _bound_once_and_never_mutated(node.id, ctx) and _certainly_empty(ctx.module_assigns[node.id][0], ctx)
    return False


def unbuildable(ext: Extension, ctx: AnalysisContext) -> bool:
    """A load_inline whose `functions=` torch's generated main.cpp can never declare (empty cpp_sources)."""
    call = ext.node
    if ext.origin != "load_inline" or call is None or not ext.functions:
        return False
    kwargs = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    cpp = kwargs.get("cpp_sources", call.args[1] if len(call.args) > 1 else None)
    return "functions" in kwargs and _certainly_empty(cpp, ctx)


def _extension_used(ext: Extension, ctx: AnalysisContext) -> bool:
    if ext.names & ctx.reachable_names:
        return True
    return ext.node is not None and ctx.in_reachable(ext.node)


def _launched_by_extension(ext: Extension, ctx: AnalysisContext, info: LaunchInfo) -> set[str]:
    defined = {k for s in ext.sources for k in s.info.kernels}
    if ext.origin == "cupy":
        return defined & (ext.kernel_args | ctx.reachable_names)
    if ext.origin != "load_inline":
        named = defined & ctx.reachable_names
        if not named and len(defined) == 1:  # a one-kernel module used on the forward path launches it
            named = set(defined)
        via_host = set()
        for src in ext.sources:
            via_host |= src.info.kernels_reachable_from(set(src.info.host_functions) & ctx.reachable_names)
        return named | via_host
    used = ext.functions & ctx.reachable_names if ext.functions else set()
    info.functions_used.extend(sorted(used))
    launched: set[str] = set()
    for src in ext.sources:
        roots = (
            {src.info.pybind_exports.get(f, f) for f in used}
            if ext.functions
            else set(src.info.host_functions)
        )
        launched |= src.info.kernels_reachable_from(roots)
    return launched


def _site_names(ctx: AnalysisContext, info: LaunchInfo, exts: list[Extension]) -> set[str]:
    """Names whose mention on the forward path is a launch site."""
    names = set(info.kernels_launched) | set(info.triton_launched) | set(info.functions_used)
    for ext in exts:
        names |= ext.names
    # self.op = ext.fn in __init__; module-level op = ext.fn: their holders are launch sites too.
    holders: set[str] = set()
    if ctx.model_new is not None:
        for node in ast.walk(ctx.model_new):
            if isinstance(node, ast.Assign):
                used = {getattr(n, "id", None) or getattr(n, "attr", None) for n in ast.walk(node.value)}
                if used & names:
                    holders |= {t.attr for t in node.targets if isinstance(t, ast.Attribute)}
    for name, values in ctx.module_assigns.items():
        for v in values:
            if {getattr(n, "id", None) or getattr(n, "attr", None) for n in ast.walk(v)} & names:
                holders.add(name)
    return names | holders


def _fallback_try(ctx: AnalysisContext, node: ast.AST) -> ast.Try | None:
    """The `try` whose body holds `node` and whose handler does other work (a fallback), if any."""
    child, cur = node, ctx.parents.get(node)
    while cur is not None:
        if isinstance(cur, ast.Try) and any(child is s for s in cur.body):
            for handler in cur.handlers:
                if any(isinstance(n, ast.Call | ast.Return) for s in handler.body for n in ast.walk(s)):
                    return cur
        child, cur = cur, ctx.parents.get(cur)
    return None


def _check_fallback(ctx: AnalysisContext, info: LaunchInfo, exts: list[Extension]) -> None:
    names = _site_names(ctx, info, exts)
    sites: list[ast.AST] = []
    for fn in ctx.reachable:
        for node in ast.walk(fn):
            name = getattr(node, "id", None) or getattr(node, "attr", None)
            if isinstance(node, ast.Name | ast.Attribute) and name in names:
                sites.append(node)
    if not sites:
        return
    tries = [_fallback_try(ctx, s) for s in sites]
    if all(t is not None for t in tries):
        info.fallback_only = True
        info.fallback_lines = sorted({t.lineno for t in tries if t is not None})


def launch_info(ctx: AnalysisContext) -> LaunchInfo:
    """Compute (once per context) what is defined and what the forward path launches."""
    cached = getattr(ctx, "_launch_info", None)
    if cached is not None:
        return cached
    info = LaunchInfo()
    launched: set[str] = set()
    used_exts: list[Extension] = []
    for ext in ctx.extensions:
        info.functions_exported.extend(sorted(ext.functions))
        if _extension_used(ext, ctx):
            used_exts.append(ext)
            got = _launched_by_extension(ext, ctx, info)
            if unbuildable(ext, ctx):
                info.unbuildable_kernels.extend(sorted(got))  # never built, so never launched
                continue
            launched |= got
            if any(s.info.has_inline_asm for s in ext.sources) and (
                got or not any(s.info.kernels for s in ext.sources)
            ):
                info.inline_asm_launched = True
        else:
            info.unused_extensions.append(ext)
    for cs in ctx.cuda_strings:
        for name in cs.info.kernels:
            if name not in info.kernels_defined:
                info.kernels_defined.append(name)
        if cs.origin == "heuristic":
            launched |= set(cs.info.kernels) & ctx.reachable_names
    info.kernels_launched = [k for k in info.kernels_defined if k in launched]
    info.triton_defined = list(ctx.triton_kernels)
    info.triton_launched = [k for k in ctx.triton_kernels if k in ctx.reachable_names]
    _check_fallback(ctx, info, used_exts)
    ctx._launch_info = info  # type: ignore[attr-defined]
    return info


def classify_kernel(ctx: AnalysisContext, changes_global_flags: bool) -> KernelClass:
    """Kernel class by what the forward path is guaranteed to launch (see module docstring)."""
    info = launch_info(ctx)
    if not info.fallback_only:
        if info.kernels_launched or info.inline_asm_launched:
            return KernelClass.CUSTOM_CUDA
        if info.triton_launched:
            return KernelClass.TRITON
    return KernelClass.FLAGS_ONLY if changes_global_flags else KernelClass.PYTORCH_ONLY
