"""The parsed view of one candidate that every static rule reads: imports, compiled CUDA strings, the
forward path and what it launches.

Nothing here executes candidate code: it is `ast.parse` plus the CUDA tokenizer of `cuda_source`.

The *forward path* is `ModelNew.forward` plus, transitively, the methods it calls through `self.`, the
module-level functions and classes it names, and the values of the `self.x` attributes and module-level
variables it reads (so `self.op = ext.relu` in `__init__` then `self.op(x)` in forward counts as a use of
`relu`). Limits: calls through containers, `getattr` with computed names, or code built at run time are
not followed; a name that is only *mentioned* on the forward path counts as used.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from cudal1.analysis.cuda_source import CudaSourceInfo, scan_cuda_source
from cudal1.core.syntax import parse as parse_python

__all__ = ["AnalysisContext", "CudaString", "Extension", "build_context", "call_name", "qualname"]

# Rationale: the entry points through which a candidate can compile CUDA/C++; strings passed to them are
# analysed as CUDA even when they do not contain `__global__`.
CPP_EXTENSION_LOADERS = {
    "torch.utils.cpp_extension.load_inline",
    "torch.utils.cpp_extension.load",
    "torch.utils.cpp_extension.load_inline.__call__",
}
CUPY_COMPILERS = {"cupy.RawKernel", "cupy.RawModule", "cupy.ElementwiseKernel", "cupy.ReductionKernel"}
RAW_CUDA_MODULE = "cudal1.raw_cuda"
# Rationale: other ways to reach NVRTC or the driver directly compile kernels as well.
OTHER_COMPILERS = {
    "cuda.nvrtc.nvrtcCreateProgram",
    "cuda.bindings.nvrtc.nvrtcCreateProgram",
    "pycuda.compiler.SourceModule",
    "numba.cuda.jit",
}


@dataclass
class CudaString:
    """A CUDA/C++ source string the candidate compiles, with where it sits in the Python file."""

    text: str
    py_line: int  # Python line of the string's first character
    origin: str  # "load_inline" | "raw_cuda" | "cupy" | "other" | "heuristic"
    info: CudaSourceInfo

    def py_line_of(self, cuda_line: int) -> int:
        return self.py_line + cuda_line - 1


@dataclass
class Extension:
    """One compile call (load_inline, raw-CUDA, cupy) and the Python names bound to its result."""

    origin: str
    line: int
    names: set[str] = field(default_factory=set)  # variables / self attributes holding the result
    functions: set[str] = field(default_factory=set)  # functions=[...] exported to Python
    sources: list[CudaString] = field(default_factory=list)
    kernel_args: set[str] = field(default_factory=set)  # cupy RawKernel kernel names
    node: ast.Call | None = None  # the compile call itself


@dataclass
class AnalysisContext:
    """Everything the rules need, built once per candidate."""

    source: str
    tree: ast.Module
    imports: dict[str, str]  # local name -> qualified name
    module_assigns: dict[str, list[ast.AST]]  # module-level name -> assigned values
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]  # module-level functions
    classes: dict[str, ast.ClassDef]
    model_new: ast.ClassDef | None
    forward: ast.FunctionDef | None
    cuda_strings: list[CudaString]
    extensions: list[Extension]
    reachable: list[ast.AST]  # function nodes on the forward path
    reachable_names: set[str]  # identifiers, attribute names and string constants used on it
    triton_kernels: dict[str, int]  # @triton.jit name -> line
    reference: ast.Module | None = None
    reference_source: str | None = None
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)

    def qual(self, node: ast.AST) -> str | None:
        return qualname(node, self.imports)

    def in_reachable(self, node: ast.AST) -> bool:
        """True when `node` sits inside a function on the forward path."""
        cur: ast.AST | None = node
        reach = {id(f) for f in self.reachable}
        while cur is not None:
            if id(cur) in reach:
                return True
            cur = self.parents.get(cur)
        return False


def qualname(node: ast.AST, imports: dict[str, str]) -> str | None:
    """Dotted name of `a.b.c` with the leading import alias resolved (`nn.ReLU` -> `torch.nn.ReLU`)."""
    parts: list[str] = []
    cur = node
    while isinstance(cur, ast.Attribute):
        parts.append(cur.attr)
        cur = cur.value
    if isinstance(cur, ast.Call):  # torch.cuda.current_stream().wait_stream -> keep the chain readable
        inner = qualname(cur.func, imports)
        if inner is None:
            return None
        parts.append(inner + "()")
        return ".".join(reversed(parts))
    if not isinstance(cur, ast.Name):
        return None
    parts.append(imports.get(cur.id, cur.id))
    return ".".join(reversed(parts))


def call_name(node: ast.Call, imports: dict[str, str]) -> str | None:
    return qualname(node.func, imports)


def _collect_imports(tree: ast.Module) -> dict[str, str]:
    imports: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    imports[alias.asname] = alias.name
                else:
                    imports[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return imports


def _string_value(node: ast.AST, assigns: dict[str, list[ast.AST]], depth: int = 0) -> str | None:
    """Best-effort static value of a string expression (constants, names, +, f-strings, lists of str)."""
    if depth > 8:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in assigns:
        vals = [_string_value(v, assigns, depth + 1) for v in assigns[node.id]]
        vals = [v for v in vals if v]
        return "\n".join(vals) if vals else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = (
            _string_value(node.left, assigns, depth + 1),
            _string_value(node.right, assigns, depth + 1),
        )
        return (left or "") + (right or "") if (left or right) else None
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else " 0 " for v in node.values)
    if isinstance(node, ast.List | ast.Tuple):
        vals = [_string_value(e, assigns, depth + 1) for e in node.elts]
        vals = [v for v in vals if v]
        return "\n".join(vals) if vals else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _string_value(node.func.value, assigns, depth + 1)
    return None


def _string_line(node: ast.AST, assigns: dict[str, list[ast.AST]]) -> int:
    if isinstance(node, ast.Name) and assigns.get(node.id):
        return _string_line(assigns[node.id][0], assigns)
    if isinstance(node, ast.List | ast.Tuple) and node.elts:
        return _string_line(node.elts[0], assigns)
    if isinstance(node, ast.BinOp):
        return _string_line(node.left, assigns)
    return getattr(node, "lineno", 1)


def _origin_of_call(name: str | None) -> str | None:
    if not name:
        return None
    if name in CPP_EXTENSION_LOADERS or name.endswith(("load_inline", "cpp_extension.load")):
        return "load_inline"
    if name.startswith(RAW_CUDA_MODULE):
        return "raw_cuda"
    if name in CUPY_COMPILERS:
        return "cupy"
    if name in OTHER_COMPILERS:
        return "other"
    return None


_SOURCE_KWARGS = ("cpp_sources", "cuda_sources", "sources", "code", "source", "src", "cuda_source")


def _extension_from_call(call: ast.Call, origin: str, assigns: dict[str, list[ast.AST]]) -> Extension:
    ext = Extension(origin=origin, line=call.lineno, node=call)
    source_nodes: list[ast.AST] = [kw.value for kw in call.keywords if kw.arg in _SOURCE_KWARGS]
    if origin != "load_inline":
        source_nodes.extend(call.args[:1])
        if origin == "cupy" and len(call.args) >= 2:
            name = _string_value(call.args[1], assigns)
            if name:
                ext.kernel_args.add(name)
    else:
        source_nodes.extend(call.args[1:3])
    for kw in call.keywords:
        if kw.arg in ("functions", "kernels", "name_expressions", "names"):
            val = _string_value(kw.value, assigns)
            if val:
                ext.functions.update(v.strip() for v in val.split("\n") if v.strip())
    for snode in source_nodes:
        text = _string_value(snode, assigns)
        if text:
            ext.sources.append(CudaString(text, _string_line(snode, assigns), origin, scan_cuda_source(text)))
    if origin == "raw_cuda" and len(call.args) >= 2:
        val = _string_value(call.args[1], assigns)
        if val:
            ext.functions.update(v.strip() for v in val.split("\n") if v.strip())
    for src in ext.sources:
        ext.functions.update(src.info.pybind_exports)
    return ext


def _target_names(target: ast.AST) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Attribute):
        return {target.attr}
    if isinstance(target, ast.Tuple | ast.List):
        return set().union(*(_target_names(e) for e in target.elts)) if target.elts else set()
    return set()


def _collect_extensions(
    tree: ast.Module,
    imports: dict[str, str],
    assigns: dict[str, list[ast.AST]],
    parents: dict[ast.AST, ast.AST],
) -> list[Extension]:
    exts: list[Extension] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        origin = _origin_of_call(call_name(node, imports))
        if origin is None:
            continue
        ext = _extension_from_call(node, origin, assigns)
        parent = parents.get(node)
        while isinstance(parent, ast.Call | ast.Attribute | ast.Subscript | ast.Await):
            parent = parents.get(parent)
        if isinstance(parent, ast.Assign):
            for t in parent.targets:
                ext.names |= _target_names(t)
        elif isinstance(parent, ast.AnnAssign | ast.NamedExpr):
            ext.names |= _target_names(parent.target)
        elif isinstance(parent, ast.Return):
            fn = parents.get(parent)
            while fn is not None and not isinstance(fn, ast.FunctionDef):
                fn = parents.get(fn)
            if fn is not None:
                ext.names.add(fn.name)
        exts.append(ext)
    return exts


def _heuristic_cuda_strings(tree: ast.Module, known: set[str]) -> list[CudaString]:
    """Any string constant that looks like CUDA (`__global__`, `asm volatile`, `<<<`) not already found."""
    out: list[CudaString] = []
    # Bare string statements (docstrings) are never compiled, even when they talk about `__global__`.
    bare = {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if id(node) in bare:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value not in known:
            text = node.value
            if "__global__" in text or "asm volatile" in text or "<<<" in text:
                out.append(CudaString(text, node.lineno, "heuristic", scan_cuda_source(text)))
    return out


def _is_triton_jit(dec: ast.AST, imports: dict[str, str]) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    name = qualname(target, imports) or ""
    return name.startswith("triton.") and name.rsplit(".", 1)[-1] in ("jit", "autotune", "heuristics")


def _names_in(node: ast.AST) -> set[str]:
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and len(sub.value) < 80:
            names.add(sub.value)
    return names


def _self_attr_values(cls: ast.ClassDef | None) -> dict[str, list[ast.AST]]:
    out: dict[str, list[ast.AST]] = {}
    if cls is None:
        return out
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.setdefault(t.attr, []).append(node.value)
    return out


def _is_compile_call(node: ast.AST, imports: dict[str, str]) -> bool:
    """A compile call's arguments (sources, exported names) must not count as uses on the forward path."""
    return isinstance(node, ast.Call) and _origin_of_call(call_name(node, imports)) is not None


def _walk_forward_path(ctx: AnalysisContext) -> None:
    """Fill `ctx.reachable` and `ctx.reachable_names` from `ModelNew.forward` (see module docstring)."""
    if ctx.forward is None:
        return
    methods = (
        {n.name: n for n in ctx.model_new.body if isinstance(n, ast.FunctionDef)} if ctx.model_new else {}
    )
    self_vals = _self_attr_values(ctx.model_new)
    seen_fn: set[int] = set()
    seen_names: set[str] = set()
    todo: list[ast.AST] = [ctx.forward]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if id(node) in seen_fn:
                continue
            seen_fn.add(id(node))
            ctx.reachable.append(node)
        for name in _names_in(node) - seen_names:
            seen_names.add(name)
            if name in methods:
                todo.append(methods[name])
            if name in self_vals:
                todo.extend(v for v in self_vals[name] if not _is_compile_call(v, ctx.imports))
            if name in ctx.functions:
                todo.append(ctx.functions[name])
            if name in ctx.classes and ctx.classes[name] is not ctx.model_new:
                todo.append(ctx.classes[name])
            if name in ctx.module_assigns:
                todo.extend(v for v in ctx.module_assigns[name] if not _is_compile_call(v, ctx.imports))
    ctx.reachable_names = seen_names


def _parent_map(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return parents


def build_context(source: str, reference_source: str | None = None) -> AnalysisContext:
    """Parse `source` (raises SyntaxError) and compute the shared view; never executes anything."""
    tree = parse_python(source)
    imports = _collect_imports(tree)
    parents = _parent_map(tree)
    assigns: dict[str, list[ast.AST]] = {}
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    classes: dict[str, ast.ClassDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(parents.get(node), ast.Module | ast.If | ast.Try):
            for t in node.targets:
                for name in _target_names(t) if isinstance(t, ast.Name | ast.Tuple) else ():
                    assigns.setdefault(name, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            if isinstance(parents.get(node), ast.Module):
                assigns.setdefault(node.target.id, []).append(node.value)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = node
    model_new = classes.get("ModelNew")
    forward = (
        next((n for n in model_new.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
        if model_new
        else None
    )
    extensions = _collect_extensions(tree, imports, assigns, parents)
    cuda_strings = [s for e in extensions for s in e.sources]
    cuda_strings += _heuristic_cuda_strings(tree, {s.text for s in cuda_strings})
    triton = {
        n.name: n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and any(_is_triton_jit(d, imports) for d in n.decorator_list)
    }
    reference = None
    if reference_source is not None:
        try:
            reference = parse_python(reference_source)
        except SyntaxError:
            reference = None
    ctx = AnalysisContext(
        source=source,
        tree=tree,
        imports=imports,
        module_assigns=assigns,
        functions=functions,
        classes=classes,
        model_new=model_new,
        forward=forward,
        cuda_strings=cuda_strings,
        extensions=extensions,
        reachable=[],
        reachable_names=set(),
        triton_kernels=triton,
        reference=reference,
        reference_source=reference_source,
        parents=parents,
    )
    _walk_forward_path(ctx)
    return ctx
