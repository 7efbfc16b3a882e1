"""Static rules about the values a candidate produces: precision downcasts, lazy tensor subclasses,
constant outputs, uninitialised (stale-memory) outputs, and in-place mutation of the inputs.

Covered: the common spellings on the forward path (`.half()`, `dtype=torch.float16`, `__half` in CUDA,
`torch.empty_like` returned, `x.add_()`, `x[...] =`, `out=x`, `inplace=True`, views of inputs).
Not covered: a kernel that writes into an input pointer or skips elements (only the runtime sees that:
input checksums and poisoned memory), aliases made through containers or helper functions, and dtype
changes done in C++ through computed `ScalarType`s. When the reference itself computes in half precision,
`precision_downcast` stays quiet.
"""

from __future__ import annotations

import ast

from cudal1.analysis._base import flag, forward_params, matches
from cudal1.analysis.context import AnalysisContext
from cudal1.core.types import Flag, Severity

# Rationale: dtypes that are a downcast for an fp32 task.
LOW_DTYPES = (
    "torch.float16",
    "torch.half",
    "torch.bfloat16",
    "torch.float8_e4m3fn",
    "torch.float8_e5m2",
    "torch.float8_e4m3fnuz",
    "torch.float8_e5m2fnuz",
    "torch.HalfTensor",
    "torch.cuda.HalfTensor",
    "torch.BFloat16Tensor",
    "torch.cuda.BFloat16Tensor",
)
AUTOCAST_APIS = ("torch.autocast", "torch.cuda.amp", "torch.amp", "torch.cpu.amp")
# Rationale: CUDA types, conversions and library math modes that compute an fp32 task in lower precision.
CUDA_LOW_PRECISION = {
    "__half": "half-precision type",
    "__half2": "half-precision type",
    "half2": "half-precision type",
    "__nv_bfloat16": "bfloat16 type",
    "__nv_bfloat162": "bfloat16 type",
    "nv_bfloat16": "bfloat16 type",
    "__float2half": "fp32->fp16 conversion",
    "__float2half_rn": "fp32->fp16 conversion",
    "__floats2half2_rn": "fp32->fp16 conversion",
    "__float22half2_rn": "fp32->fp16 conversion",
    "__float2bfloat16": "fp32->bf16 conversion",
    "__float2bfloat16_rn": "fp32->bf16 conversion",
    "__nv_fp8_e4m3": "fp8 type",
    "__nv_fp8_e5m2": "fp8 type",
    "kHalf": "half tensors",
    "kFloat16": "half tensors",
    "kBFloat16": "bfloat16 tensors",
    "CUBLAS_TF32_TENSOR_OP_MATH": "TF32 cuBLAS math",
    "CUBLAS_COMPUTE_32F_FAST_TF32": "TF32 cuBLAS compute",
    "CUBLAS_COMPUTE_32F_FAST_16F": "fp16 cuBLAS compute",
    "CUBLAS_COMPUTE_32F_FAST_16BF": "bf16 cuBLAS compute",
    "CUBLAS_TENSOR_OP_MATH": "tensor-op cuBLAS math",
    "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION": "down-converting cuDNN math",
    "CUDA_R_16F": "fp16 cuBLAS operand",
    "CUDA_R_16BF": "bf16 cuBLAS operand",
    "tf32": "TF32 tensor-core operand",
    "__float_to_tf32": "TF32 rounding",
}
PTX_LOW_PRECISION = (".f16", ".bf16", ".tf32", ".e4m3", ".e5m2")
# Rationale: factories whose result does not depend on any input value.
CONST_FACTORIES = (
    "torch.zeros",
    "torch.ones",
    "torch.full",
    "torch.zeros_like",
    "torch.ones_like",
    "torch.full_like",
    "torch.tensor",
    "torch.scalar_tensor",
)
CONST_METHODS = ("new_zeros", "new_ones", "new_full", "new_tensor")
# Rationale: allocations that leave memory uninitialised (the caching allocator may hand back old results).
EMPTY_FACTORIES = ("torch.empty", "torch.empty_like", "torch.empty_strided")
EMPTY_METHODS = ("new_empty", "new_empty_strided")
# Rationale: methods that return a view (or the same tensor) of their receiver.
VIEW_METHODS = {
    "view",
    "view_as",
    "reshape",
    "flatten",
    "squeeze",
    "unsqueeze",
    "contiguous",
    "transpose",
    "t",
    "permute",
    "expand",
    "expand_as",
    "as_strided",
    "narrow",
    "select",
    "unflatten",
    "detach",
    "movedim",
    "unfold",
    "diagonal",
    "T",
    "mT",
    "data",
    "real",
    "imag",
    "to",
    "cuda",
    "float",
}
SAFE_UNDERSCORE_METHODS = {"requires_grad_", "retain_grad", "share_memory_", "record_stream"}
TENSOR_BASES = ("torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase", "torch.nn.Parameter")
SUBCLASS_APIS = (
    "torch.Tensor._make_subclass",
    "torch.Tensor._make_wrapper_subclass",
    "torch.utils._python_dispatch",
    "torch.overrides",
    "torch._C._disabled_torch_function_impl",
)


def _reference_uses_low_precision(ctx: AnalysisContext) -> bool:
    src = ctx.reference_source or ""
    return any(w in src for w in ("float16", "bfloat16", ".half()", "torch.half", "autocast", "float8"))


def _ptx_flags(ctx: AnalysisContext) -> list[Flag]:
    out: list[Flag] = []
    for cs in ctx.cuda_strings:
        toks = cs.info.tokens
        for i, tok in enumerate(toks):
            if (
                tok.kind == "string"
                and i >= 2
                and any(t.value in ("asm", "__asm__") for t in toks[i - 3 : i])
            ):
                if any(p in tok.value for p in PTX_LOW_PRECISION):
                    out.append(
                        flag(
                            "precision_downcast",
                            f"low-precision PTX `{tok.value.strip()[:40]}`",
                            cs.py_line_of(tok.line),
                        )
                    )
            elif (
                tok.kind == "ident" and tok.value in ("Half", "BFloat16") and i and toks[i - 1].value == "::"
            ):
                out.append(
                    flag(
                        "precision_downcast", f"uses at::{tok.value} in CUDA source", cs.py_line_of(tok.line)
                    )
                )
            elif tok.kind == "ident" and tok.value == "half" and i + 1 < len(toks):
                if toks[i + 1].kind == "ident" or toks[i + 1].value in ("*", ">", "&"):
                    out.append(
                        flag(
                            "precision_downcast",
                            "half-precision type (`half` in CUDA source)",
                            cs.py_line_of(tok.line),
                        )
                    )
    return out


def check_precision_downcast(ctx: AnalysisContext) -> list[Flag]:
    """fp16/bf16/fp8/TF32 in Python (casts, dtype=, autocast) and in CUDA (types, conversions, math modes)."""
    if _reference_uses_low_precision(ctx):
        return []
    out: list[Flag] = []
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Attribute | ast.Name) and not isinstance(
            ctx.parents.get(node), ast.Attribute
        ):
            name = ctx.qual(node)
            if matches(name, LOW_DTYPES):
                out.append(flag("precision_downcast", f"uses {name}", node.lineno))
            elif matches(name, AUTOCAST_APIS):
                out.append(flag("precision_downcast", f"uses {name}", node.lineno))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("half", "bfloat16") and not node.args:
                out.append(flag("precision_downcast", f"casts with .{node.func.attr}()", node.lineno))
    for cs in ctx.cuda_strings:
        found = cs.info.idents()
        for ident, what in CUDA_LOW_PRECISION.items():
            if ident in found:
                out.append(
                    flag(
                        "precision_downcast",
                        f"{what} (`{ident}` in CUDA source)",
                        cs.py_line_of(found[ident]),
                    )
                )
    return out + _ptx_flags(ctx)


def check_lazy_tensor(ctx: AnalysisContext) -> list[Flag]:
    """Tensor subclasses, __torch_function__/__torch_dispatch__, and forwards returning non-tensors."""
    out: list[Flag] = []
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if matches(ctx.qual(base), TENSOR_BASES):
                    out.append(
                        flag("lazy_tensor", f"class {node.name} subclasses {ctx.qual(base)}", node.lineno)
                    )
        elif isinstance(node, ast.FunctionDef) and node.name in ("__torch_function__", "__torch_dispatch__"):
            out.append(flag("lazy_tensor", f"defines {node.name}", node.lineno))
        elif isinstance(node, ast.Attribute) and matches(ctx.qual(node), SUBCLASS_APIS):
            out.append(flag("lazy_tensor", f"uses {ctx.qual(node)}", node.lineno))
    if ctx.forward is not None:
        local_classes = {n for n in ctx.classes if n != "ModelNew"}
        for node in ast.walk(ctx.forward):
            if isinstance(node, ast.Yield | ast.YieldFrom):
                out.append(flag("lazy_tensor", "forward is a generator, not a tensor function", node.lineno))
            if not isinstance(node, ast.Return) or node.value is None:
                continue
            val = node.value
            if isinstance(val, ast.Lambda):
                out.append(flag("lazy_tensor", "forward returns a lambda", node.lineno))
            elif (
                isinstance(val, ast.Call) and isinstance(val.func, ast.Name) and val.func.id in local_classes
            ):
                out.append(flag("lazy_tensor", f"forward returns a {val.func.id} object", node.lineno))
    return out


def _factory_kind(ctx: AnalysisContext, node: ast.AST) -> str | None:
    """'const' / 'empty' when `node` is a constant-valued or uninitialised allocation."""
    if not isinstance(node, ast.Call):
        return None
    name = ctx.qual(node.func) or ""
    attr = node.func.attr if isinstance(node.func, ast.Attribute) else ""
    if name in CONST_FACTORIES or attr in CONST_METHODS:
        return "const"
    if name in EMPTY_FACTORIES or attr in EMPTY_METHODS:
        return "empty"
    return None


def _returned_names(fn: ast.AST) -> dict[str, int]:
    out: dict[str, int] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and node.value is not None:
            vals = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for v in vals:
                if isinstance(v, ast.Name):
                    out.setdefault(v.id, node.lineno)
    return out


def _allocations(ctx: AnalysisContext, fn: ast.AST, kind: str) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if _factory_kind(ctx, node.value) == kind:
                out[node.targets[0].id] = (node.lineno, ctx.qual(node.value.func) or "allocation")
    return out


def _uses_besides_return(fn: ast.AST, name: str) -> int:
    count = 0
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            count += 1
    returns = sum(
        1
        for node in ast.walk(fn)
        if isinstance(node, ast.Return) and node.value is not None
        for v in ast.walk(node.value)
        if isinstance(v, ast.Name) and v.id == name
    )
    return count - returns


def check_constant_output(ctx: AnalysisContext) -> list[Flag]:
    """Forward returns zeros/ones/full (or `x * 0`) that no kernel or op ever fills."""
    if ctx.forward is None:
        return []
    out: list[Flag] = []
    for node in ast.walk(ctx.forward):
        if isinstance(node, ast.Return) and node.value is not None:
            v = node.value
            if _factory_kind(ctx, v) == "const":
                out.append(flag("constant_output", f"forward returns {ast.unparse(v)[:50]}", node.lineno))
            elif (
                isinstance(v, ast.BinOp)
                and isinstance(v.op, ast.Mult)
                and any(isinstance(s, ast.Constant) and s.value == 0 for s in (v.left, v.right))
            ):
                out.append(flag("constant_output", "forward returns a product with 0", node.lineno))
    returned = _returned_names(ctx.forward)
    for name, (line, what) in _allocations(ctx, ctx.forward, "const").items():
        if name in returned and _uses_besides_return(ctx.forward, name) == 0:
            out.append(
                flag(
                    "constant_output",
                    f"returns `{name}` from {what} (line {line}), never filled",
                    returned[name],
                )
            )
    return out


def check_stale_memory(ctx: AnalysisContext) -> list[Flag]:
    """Outputs allocated with torch.empty* and returned (runtime poisoning decides whether they leak)."""
    out: list[Flag] = []
    for fn in ctx.reachable:
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        returned = _returned_names(fn)
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Return)
                and node.value is not None
                and _factory_kind(ctx, node.value) == "empty"
            ):
                out.append(
                    flag(
                        "stale_memory",
                        f"returns {ast.unparse(node.value)[:40]} (uninitialised, never written)",
                        node.lineno,
                    )
                )
        for name, (line, what) in _allocations(ctx, fn, "empty").items():
            if name not in returned:
                continue
            unwritten = _uses_besides_return(fn, name) == 0
            detail = "never written" if unwritten else "every element must be written"
            out.append(flag("stale_memory", f"returns `{name}` from {what} (uninitialised; {detail})", line))
    for cs in ctx.cuda_strings:
        toks = cs.info.tokens
        for i, tok in enumerate(toks):
            if tok.value in ("empty", "empty_like", "empty_strided") and i and toks[i - 1].value == "::":
                out.append(
                    flag(
                        "stale_memory",
                        f"allocates with ::{tok.value} in C++ (uninitialised)",
                        cs.py_line_of(tok.line),
                        Severity.INFO,
                    )
                )
                break
    return out


def _is_alias_expr(node: ast.AST, aliases: set[str]) -> bool:
    while True:
        if isinstance(node, ast.Name):
            return node.id in aliases
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Attribute) and node.attr in VIEW_METHODS:
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in VIEW_METHODS
        ):
            node = node.func.value
        else:
            return False


def _event_key(node: ast.AST) -> tuple[int, int]:
    if isinstance(node, ast.Assign):  # an assignment takes effect after its value ran
        return (node.end_lineno or node.lineno, node.end_col_offset or 0)
    return (node.lineno, node.col_offset)


def _mutation(ctx: AnalysisContext, node: ast.AST, aliases: set[str]) -> str | None:
    """Describe how `node` mutates an input alias, or None."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_"):
            if func.attr not in SAFE_UNDERSCORE_METHODS and _is_alias_expr(func.value, aliases):
                return f"calls {ast.unparse(func)[:40]}() in place on an input"
        name = ctx.qual(func) or ""
        first = node.args[0] if node.args else None
        if (
            name.startswith("torch.")
            and name.endswith("_")
            and first is not None
            and _is_alias_expr(first, aliases)
        ):
            return f"calls {name} on an input"
        for kw in node.keywords:
            if kw.arg == "out" and _is_alias_expr(kw.value, aliases):
                return f"writes out={ast.unparse(kw.value)} (an input)"
            if kw.arg == "inplace" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                if first is not None and _is_alias_expr(first, aliases):
                    return f"calls {name or 'op'}(inplace=True) on an input"
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign):
        targets = [node.target]
    for t in targets:
        if isinstance(t, ast.Subscript) and _is_alias_expr(t.value, aliases):
            return f"assigns into {ast.unparse(t)[:40]} (an input)"
        if isinstance(node, ast.AugAssign) and isinstance(t, ast.Name) and t.id in aliases:
            return f"updates input `{t.id}` in place ({ast.unparse(node)[:40]})"
        if isinstance(t, ast.Attribute) and t.attr == "data" and _is_alias_expr(t.value, aliases):
            return f"overwrites {ast.unparse(t)} (an input)"
    return None


def check_input_mutation(ctx: AnalysisContext) -> list[Flag]:
    """In-place ops on forward's parameters or views of them (flow-insensitive, in source order)."""
    if ctx.forward is None:
        return []
    aliases = set(forward_params(ctx.forward))
    out: list[Flag] = []
    nodes = [n for n in ast.walk(ctx.forward) if hasattr(n, "lineno") and n is not ctx.forward]
    for node in sorted(nodes, key=_event_key):
        what = _mutation(ctx, node, aliases)
        if what:
            out.append(flag("input_mutation", what, node.lineno))
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    if _is_alias_expr(node.value, aliases):
                        aliases.add(t.id)
                    else:
                        aliases.discard(t.id)
    return out


__all__ = [
    "check_constant_output",
    "check_input_mutation",
    "check_lazy_tensor",
    "check_precision_downcast",
    "check_stale_memory",
]
