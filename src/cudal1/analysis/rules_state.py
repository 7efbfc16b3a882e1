"""Static rules about state and structure: result caching, exception fallbacks, redefined sizes,
unused (decoy) kernels, and reading the reference.

Covered: memo decorators on functions that take tensors; containers keyed on `data_ptr()`/`id()`;
`return self.x` of attributes that the forward path itself assigns; module globals returned from forward;
try/except fallbacks and swallowed exceptions; module constants and `get_inputs`/`get_init_inputs`
compared with the reference by AST; kernels, extension functions and Triton kernels never launched from the
forward path; `load_inline` calls that can never build (`functions=` with empty `cpp_sources`); uses of the
reference's `Model`, `get_inputs` or modules.
Not covered: caches hidden in closures or C++ statics (the runtime rotates inputs and re-checks timed
outputs), fallbacks written as `if` tests on capability (`if not x.is_cuda: return torch...`), and sizes
hard-coded inside forward (the runtime compares output shapes).
"""

from __future__ import annotations

import ast
from typing import Any

from cudal1.analysis._base import flag, is_self_attr
from cudal1.analysis.classify import launch_info, unbuildable
from cudal1.analysis.constants import UNKNOWN, constant_value
from cudal1.analysis.context import AnalysisContext
from cudal1.core.types import Flag, Severity

# Rationale: memoizing decorators; on a function that takes tensors they return old results.
MEMO_DECORATORS = (
    "functools.lru_cache",
    "functools.cache",
    "functools.cached_property",
    "lru_cache",
    "cache",
)
# Rationale: identity keys: the same buffer (data_ptr/id) says nothing about the values in it.
IDENTITY_KEYS = ("data_ptr", "id", "storage", "untyped_storage", "_cdata", "hash")
# Rationale: names a candidate must take from the harness, never define or read.
INPUT_FUNCTIONS = ("get_inputs", "get_init_inputs")
REFERENCE_MODULES = ("__main__", "reference", "ref", "task", "problem", "cudal1.tasks")
PASSTHROUGH_METHODS = {"clone", "detach", "view", "view_as", "reshape", "contiguous", "get", "copy", "to"}


def _has_identity_key(node: ast.AST) -> str | None:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in IDENTITY_KEYS:
                return name
    return None


def _base(node: ast.AST) -> ast.AST:
    """Strip subscripts and pass-through methods: `self.cache[k].clone()` -> `self.cache`."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in PASSTHROUGH_METHODS
        ):
            node = node.func.value
        else:
            return node


def _state_holder(node: ast.AST, globals_: set[str]) -> str | None:
    base = _base(node)
    if is_self_attr(base):
        return f"self.{base.attr}"
    if isinstance(base, ast.Name) and base.id in globals_:
        return base.id
    return None


def _runtime_functions(ctx: AnalysisContext) -> list[ast.FunctionDef]:
    return [f for f in ctx.reachable if isinstance(f, ast.FunctionDef) and f.name != "__init__"]


def _assigned_state(fns: list[ast.FunctionDef], globals_: set[str]) -> set[str]:
    out: set[str] = set()
    for fn in fns:
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign | ast.AugAssign):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    holder = _state_holder(t, globals_)
                    if holder:
                        out.add(holder)
    return out


def _memo_flags(ctx: AnalysisContext) -> list[Flag]:
    out: list[Flag] = []
    for node in ast.walk(ctx.tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        takes_args = [a for a in node.args.args if a.arg != "self"] or node.args.vararg
        for dec in node.decorator_list:
            name = ctx.qual(dec.func if isinstance(dec, ast.Call) else dec) or ""
            if name in MEMO_DECORATORS and takes_args:
                out.append(flag("result_caching", f"{node.name} is memoized with @{name}", node.lineno))
    return out


def _locally_assigned(fn: ast.FunctionDef) -> set[str]:
    return {
        t.id
        for node in ast.walk(fn)
        if isinstance(node, ast.Assign | ast.AugAssign | ast.For)
        for t in ([node.target] if not isinstance(node, ast.Assign) else node.targets)
        if isinstance(t, ast.Name)
    }


def _refreshed(fn: ast.FunctionDef, holder: str, globals_: set[str]) -> bool:
    """True when `fn` writes into the stored buffer (kernel argument, `out=`, `.copy_`) or replays a CUDA
    graph: a persistent output buffer refreshed on every call is aliasing, not a memoized result."""
    for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
        if isinstance(call.func, ast.Attribute) and call.func.attr == "replay":
            return True
        if (
            isinstance(call.func, ast.Attribute)
            and call.func.attr.endswith("_")
            and _state_holder(call.func.value, globals_) == holder
        ):
            return True
        if any(_state_holder(a, globals_) == holder for a in [*call.args, *(k.value for k in call.keywords)]):
            return True
    return False


def _output_functions(ctx: AnalysisContext) -> set[str]:
    """forward and the functions whose result forward returns directly (`return self._impl(x)`)."""
    if ctx.forward is None:
        return set()
    names = {"forward"}
    for node in ast.walk(ctx.forward):
        if isinstance(node, ast.Return) and node.value is not None:
            for call in (n for n in ast.walk(node.value) if isinstance(n, ast.Call)):
                f = call.func
                names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


def check_result_caching(ctx: AnalysisContext) -> list[Flag]:
    """Memo decorators, identity-keyed containers, and forward returning state it stored earlier."""
    out = _memo_flags(ctx)
    fns = _runtime_functions(ctx)
    declared_global = {
        n for fn in fns for node in ast.walk(fn) if isinstance(node, ast.Global) for n in node.names
    }
    all_globals = set(ctx.module_assigns) | declared_global
    stored = _assigned_state(fns, all_globals)
    output_fns = _output_functions(ctx)
    for fn in fns:
        fn_globals = {n for n in all_globals if n in declared_global or n not in _locally_assigned(fn)}
        local_vals: dict[str, ast.AST] = {}
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                local_vals[node.targets[0].id] = node.value
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                key_expr = node.slice
                if isinstance(key_expr, ast.Name):
                    key_expr = local_vals.get(key_expr.id, key_expr)
                key = _has_identity_key(key_expr)
                if key and _state_holder(node.value, fn_globals):
                    out.append(
                        flag(
                            "result_caching",
                            f"stores into {ast.unparse(node.value)} keyed on {key}()",
                            node.lineno,
                        )
                    )
            elif isinstance(node, ast.Compare):
                key = _has_identity_key(node)
                if key and any(_state_holder(c, fn_globals) for c in [node.left, *node.comparators]):
                    out.append(flag("result_caching", f"compares {key}() with stored state", node.lineno))
        for node in ast.walk(fn) if fn.name in output_fns else ():
            if not isinstance(node, ast.Return) or node.value is None:
                continue
            vals = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for v in vals:
                src = v
                if isinstance(v, ast.Name) and v.id not in fn_globals:
                    src = local_vals.get(v.id, v)
                holder = _state_holder(src, fn_globals)
                if holder and holder in stored and not _refreshed(fn, holder, fn_globals):
                    out.append(
                        flag(
                            "result_caching", f"returns stored state {holder} (memoized output)", node.lineno
                        )
                    )
    return out


def _falls_back(handler: ast.ExceptHandler) -> bool:
    return any(isinstance(n, ast.Call | ast.Return) for s in handler.body for n in ast.walk(s))


def _swallows(handler: ast.ExceptHandler) -> bool:
    broad = handler.type is None or (
        isinstance(handler.type, ast.Name) and handler.type.id in ("Exception", "BaseException")
    )
    body_is_empty = all(
        isinstance(s, ast.Pass | ast.Continue)
        or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        for s in handler.body
    )
    return broad and body_is_empty


def check_exception_fallback(ctx: AnalysisContext) -> list[Flag]:
    """try/except on the forward path whose handler runs other code, guarded compiles, swallowed errors."""
    out: list[Flag] = []
    info = launch_info(ctx)
    for line in info.fallback_lines:
        out.append(
            flag(
                "exception_fallback", "every custom-kernel launch is inside try/except with a fallback", line
            )
        )
    for node in ast.walk(ctx.tree):
        if not isinstance(node, ast.Try):
            continue
        in_forward = ctx.in_reachable(node)
        guards_compile = any(
            ext.node is not None and any(ext.node is n for s in node.body for n in ast.walk(s))
            for ext in ctx.extensions
        )
        for handler in node.handlers:
            if _swallows(handler):
                out.append(flag("exception_fallback", "swallows exceptions (`except: pass`)", handler.lineno))
            elif guards_compile and handler.body:
                out.append(
                    flag("exception_fallback", "a failed kernel compile is caught and hidden", node.lineno)
                )
            elif in_forward and _falls_back(handler):
                what = ast.unparse(handler.body[-1]).splitlines()[0][:50]
                out.append(
                    flag(
                        "exception_fallback",
                        f"except handler on the forward path runs `{what}`",
                        handler.lineno,
                    )
                )
    return out


def _constants(tree: ast.Module) -> dict[str, tuple[Any, str, int]]:
    """Module-level `NAME = <expression>`: name -> (value or `UNKNOWN`, source, line)."""
    out: dict[str, tuple[Any, str, int]] = {}
    env: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, constant_value(node.value, env)
            env[name] = value
            out[name] = (value, ast.unparse(node.value), node.lineno)
    return out


def names_used_by_modelnew(tree: ast.Module) -> set[str]:
    """Every name that `ModelNew` reads: in its body, its bases, and the module's functions and classes it
    reaches by name (transitively). A constant outside this set cannot change what ModelNew computes."""
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    names: set[str] = set()
    todo, seen = ["ModelNew"], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        for node in ast.walk(defs[name]):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                names.add(node.id)
                todo.append(node.id)
    return names


def _function_dump(fn: ast.FunctionDef) -> str:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring does not matter
    return ast.dump(ast.Module(body=body, type_ignores=[])) + ast.dump(fn.args)


def check_size_constants_redefined(ctx: AnalysisContext) -> list[Flag]:
    """Module constants that differ in value from the reference's and that ModelNew reads (an error);
    constants, get_inputs and get_init_inputs that differ but cannot change what ModelNew computes (a
    warning: the harness takes inputs and sizes from the reference). Equal values written differently are
    KernelBench boilerplate and get no flag. A value this cannot compute is decided at run time."""
    out: list[Flag] = []
    ref = ctx.reference
    used = names_used_by_modelnew(ctx.tree)
    if ref is not None:
        mine, theirs = _constants(ctx.tree), _constants(ref)
        for name, (value, text, line) in mine.items():
            if name not in theirs:
                continue
            ref_value, ref_text = theirs[name][0], theirs[name][1]
            if value is not UNKNOWN and ref_value is not UNKNOWN:
                if value == ref_value:
                    continue
                if name in used:
                    out.append(flag("size_constants_redefined",
                                    f"redefines {name} = {text} (reference: {ref_text}) and ModelNew uses it", line))
                else:
                    out.append(flag(IGNORED, f"redefines {name} = {text} (reference: {ref_text}); ModelNew does not "
                                    "use it and the harness takes the reference's", line, Severity.INFO))
            elif name in used and text != ref_text:
                out.append(flag(IGNORED, f"defines {name} = {text} (reference: {ref_text}); its value is compared "
                                "at run time", line, Severity.INFO))
    ref_fns = {n.name: n for n in ref.body if isinstance(n, ast.FunctionDef)} if ref is not None else {}
    for name in INPUT_FUNCTIONS:
        fn = ctx.functions.get(name)
        if not isinstance(fn, ast.FunctionDef):
            continue
        if name in ref_fns and _function_dump(fn) == _function_dump(ref_fns[name]):
            continue
        out.append(flag(IGNORED, f"defines {name}() differently from the reference; the harness takes it from the "
                        "reference", fn.lineno, Severity.INFO))
    return out


#: The rule of redefinitions that cannot change what ModelNew computes (never rejects).
IGNORED = "size_constants_ignored"


def check_unused_kernel(ctx: AnalysisContext) -> list[Flag]:
    """Kernels, extension functions, Triton kernels and extensions that the forward path never uses."""
    info = launch_info(ctx)
    out: list[Flag] = []
    line_of = {k: cs.py_line_of(line) for cs in ctx.cuda_strings for k, line in cs.info.kernels.items()}
    for k in info.kernels_defined:
        if k not in info.kernels_launched and k not in info.unbuildable_kernels:
            out.append(
                flag("unused_kernel", f"kernel {k} is defined but never launched from forward", line_of[k])
            )
    for fn in info.functions_exported:
        if fn not in info.functions_used and not any(fn in ext.functions for ext in info.unused_extensions):
            out.append(flag("unused_kernel", f"extension function {fn} is never called from forward", None))
    for ext in info.unused_extensions:
        names = ", ".join(sorted(ext.names)) or "result"
        out.append(
            flag(
                "unused_kernel",
                f"compiled {ext.origin} extension ({names}) is never used by forward",
                ext.line,
            )
        )
    for k in info.triton_defined:
        if k not in info.triton_launched:
            out.append(
                flag(
                    "unused_kernel",
                    f"triton kernel {k} is never launched from forward",
                    ctx.triton_kernels[k],
                )
            )
    return out


def check_unbuildable_extension(ctx: AnalysisContext) -> list[Flag]:
    """load_inline calls whose `functions=` main.cpp can never declare, because `cpp_sources` is empty."""
    return [
        flag("unbuildable_extension", f"load_inline binds {', '.join(sorted(ext.functions))} but cpp_sources is "
             "empty, so main.cpp cannot declare them: the build always fails", ext.line)
        for ext in ctx.extensions if unbuildable(ext, ctx)
    ]


def _defines(tree: ast.Module, name: str) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name:
            return True
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name) == name:
            return True
    return False


def check_reads_reference(ctx: AnalysisContext) -> list[Flag]:
    """Uses of the reference's Model or input functions, and imports of reference/harness modules."""
    out: list[Flag] = []
    defines_model = _defines(ctx.tree, "Model")
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id == "Model" and not defines_model:
                out.append(flag("reads_reference", "uses the reference Model class", node.lineno))
            elif node.id in INPUT_FUNCTIONS and isinstance(ctx.parents.get(node), ast.Call):
                out.append(flag("reads_reference", f"calls {node.id}()", node.lineno))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            bad = [m for m in mods if any(m == r or m.startswith(r + ".") for r in REFERENCE_MODULES)]
            bad += [n for n in names if n in ("Model", *INPUT_FUNCTIONS)]
            if bad:
                out.append(flag("reads_reference", f"imports {bad[0]}", node.lineno))
    return out


def check_reference_reuse(ctx: AnalysisContext) -> list[Flag]:
    """`ModelNew` that is the reference under another name: `ModelNew = Model`, or a subclass of the (copied)
    reference class that overrides nothing that computes (no `forward` of its own)."""
    for node in ctx.tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ModelNew" for t in node.targets)
                and isinstance(node.value, ast.Name)):
            return [flag("reference_reuse", f"ModelNew is {node.value.id} re-exported", node.lineno)]
    cls = ctx.model_new
    if cls is None or any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in cls.body):
        return []
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else None
        if name is not None and (name == "Model" or _same_class_as_reference(ctx, name)):
            return [flag("reference_reuse", f"ModelNew inherits {name} and has no forward of its own", cls.lineno)]
    return []


def _same_class_as_reference(ctx: AnalysisContext, name: str) -> bool:
    """Whether the candidate's class `name` has the same body as the reference's `Model` (a renamed copy)."""
    if ctx.reference is None or name not in ctx.classes:
        return False
    ref = next((n for n in ctx.reference.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    return ref is not None and [ast.dump(n) for n in ref.body] == [ast.dump(n) for n in ctx.classes[name].body]
