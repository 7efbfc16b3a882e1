"""Find the `__global__` functions of a CUDA C source and parse their parameter types.

The launcher converts Python arguments to the C types declared here (an `int n` gets an int32, a
`long long n` an int64, a `const __half* x` must be given a float16 tensor), because the driver copies
exactly `sizeof(declared type)` bytes per argument and a mismatch silently corrupts the launch.

What is understood: `extern "C" __global__ ...` and `extern "C" { ... }` blocks, `__launch_bounds__`,
`__maxnreg__` and `__cluster_dims__` attributes in any position, comments, qualifiers (`const`,
`volatile`, `__restrict__`, `__grid_constant__`), pointers and `[]` arrays, the C integer/float keyword
combinations (`unsigned long long int`), the fixed-width typedefs (`int64_t`, `std::size_t`, ...),
`half`/`__half`/`__nv_bfloat16`, and CUDA vector types behind pointers (`float4*`).
Limits: macros are not expanded (a kernel declared through a macro is not found, and a macro used as a
parameter type is 'opaque'); templates are reported as not `extern "C"` (their names are mangled).
Parameters whose type is not understood are 'opaque': pointers to them accept any tensor, and by-value
opaque parameters cannot be passed from Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Canonical scalar names (torch dtype names without the prefix) of C types that may be passed by value.
SCALAR_TYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                "float16", "bfloat16", "float32", "float64")

# Typedef names, as written after `std::`/`cuda::std::` is stripped, and their canonical scalar type.
TYPEDEFS: dict[str, str] = {
    "int8_t": "int8", "uint8_t": "uint8", "int16_t": "int16", "uint16_t": "uint16",
    "int32_t": "int32", "uint32_t": "uint32", "int64_t": "int64", "uint64_t": "uint64",
    "size_t": "uint64", "ssize_t": "int64", "ptrdiff_t": "int64", "intptr_t": "int64", "uintptr_t": "uint64",
    "uint": "uint32", "ushort": "uint16", "uchar": "uint8", "ulong": "uint64",
    "half": "float16", "__half": "float16", "__nv_bfloat16": "bfloat16", "nv_bfloat16": "bfloat16",
    "__nv_fp8_e4m3": "float8_e4m3fn", "__nv_fp8_e5m2": "float8_e5m2",
}

# CUDA vector types: only meaningful behind a pointer, where they fix the tensor's element dtype.
VECTOR_ELEMENT: dict[str, str] = {}
for _prefix, _elem in (("char", "int8"), ("uchar", "uint8"), ("short", "int16"), ("ushort", "uint16"),
                       ("int", "int32"), ("uint", "uint32"), ("long", "int64"), ("ulong", "uint64"),
                       ("longlong", "int64"), ("ulonglong", "uint64"), ("float", "float32"),
                       ("double", "float64")):
    for _n in (1, 2, 3, 4):
        VECTOR_ELEMENT[f"{_prefix}{_n}"] = _elem
VECTOR_ELEMENT.update({"half2": "float16", "__half2": "float16", "__nv_bfloat162": "bfloat16",
                       "nv_bfloat162": "bfloat16"})

_C_KEYWORDS = {"unsigned", "signed", "char", "short", "int", "long", "float", "double", "bool", "void"}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__",
               "register", "struct", "class", "typename", "__const__"}
_ATTRIBUTES_WITH_ARGS = {"__launch_bounds__", "__maxnreg__", "__cluster_dims__", "__align__",
                         "__attribute__", "__declspec"}
_SCAN = re.compile(r"\s+|[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*|\(|\S")
_TOKEN = re.compile(r"(?:::)?[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*|\*|&|\[[^\]]*\]|<|>|\(|\)|,|\S")


@dataclass(frozen=True)
class CParam:
    """One kernel parameter as declared."""

    index: int
    name: str | None  # None for an unnamed parameter
    decl: str  # the declaration with normalized whitespace, e.g. "const float* __restrict__ x"
    base: str  # a SCALAR_TYPES name, "void", or "opaque"; for `float4*` the element type "float32"
    base_text: str  # the type as written without qualifiers, e.g. "unsigned int", "float4", "Params"
    pointer_depth: int  # 0: passed by value; 1: `T*` or `T x[]`; 2: `T**`
    is_const: bool  # the value (or the pointee, for pointers) is const

    @property
    def is_pointer(self) -> bool:
        return self.pointer_depth > 0

    def describe(self) -> str:
        """Human-readable 'index 2 ("n", int)' for error messages."""
        label = f'"{self.name}", ' if self.name else ""
        return f"{self.index} ({label}{self.decl_type()})"

    def decl_type(self) -> str:
        return self.base_text + "*" * self.pointer_depth


@dataclass(frozen=True)
class KernelSignature:
    """A `__global__` function: its name, parameters, and whether its symbol is unmangled."""

    name: str
    params: tuple[CParam, ...]
    extern_c: bool  # only extern "C", non-template kernels can be looked up by name
    line: int  # 1-based line of `__global__`

    def describe(self) -> str:
        return f"{self.name}({', '.join(p.decl for p in self.params)})"


def _blank_comments_and_directives(source: str) -> str:
    """Replace comments and preprocessor lines by spaces, keeping offsets and line numbers."""
    out = list(source)
    i, n = 0, len(source)
    while i < n:
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif source[i] == "#" and not source[source.rfind("\n", 0, i) + 1:i].strip():
            j = i
            while j < n and source[j] != "\n":
                j += 2 if source.startswith("\\\n", j) else 1
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def _matching(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index of the bracket closing the one at `start`, or -1."""
    depth = 0
    for k in range(start, len(text)):
        if text[k] == open_ch:
            depth += 1
        elif text[k] == close_ch:
            depth -= 1
            if depth == 0:
                return k
    return -1


def _extern_c_blocks(text: str) -> list[tuple[int, int]]:
    blocks = []
    for m in re.finditer(r'\bextern\s*"C"\s*\{', text):
        end = _matching(text, m.end() - 1, "{", "}")
        blocks.append((m.end(), end if end >= 0 else len(text)))
    return blocks


def _split_top_level(params_text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in params_text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _canonical_keywords(words: list[str]) -> str:
    """Canonical scalar type of a C keyword combination such as ['unsigned', 'long', 'long', 'int']."""
    unsigned = "unsigned" in words
    if "void" in words:
        return "void"
    if "bool" in words:
        return "bool"
    if "float" in words:
        return "float32"
    if "double" in words:
        return "opaque" if "long" in words else "float64"
    if "char" in words:
        return "uint8" if unsigned else "int8"
    if "short" in words:
        return "uint16" if unsigned else "int16"
    if "long" in words:  # LP64: long and long long are both 64-bit on Linux
        return "uint64" if unsigned else "int64"
    return "uint32" if unsigned else "int32"


def _strip_namespace(name: str) -> str:
    for prefix in ("::", "cuda::std::", "std::"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


def parse_param(text: str, index: int) -> CParam:
    """Parse one parameter declaration such as `const float* __restrict__ x` or `unsigned long long n`."""
    text = text.split("=", 1)[0].strip()
    tokens = _TOKEN.findall(text)
    idents: list[str] = []
    depth, is_const, seen_star, opaque = 0, False, False, False
    skip_parens = 0
    for k, tok in enumerate(tokens):
        if skip_parens:
            skip_parens += {"(": 1, ")": -1}.get(tok, 0)
            continue
        if tok in _ATTRIBUTES_WITH_ARGS and k + 1 < len(tokens) and tokens[k + 1] == "(":
            skip_parens = 1
            tokens[k + 1] = ""  # consumed: the loop counts from the opening parenthesis on
            continue
        if tok == "*" or tok.startswith("["):
            depth += 1
            seen_star = True
        elif tok in ("&", "<", ">", "(", ")", ","):
            opaque = True
        elif tok in ("const", "__const__"):
            is_const = is_const or not seen_star
        elif tok in _QUALIFIERS or tok == "":
            continue
        elif re.match(r"(?:::)?[A-Za-z_]", tok):
            idents.append(tok)
    name = None
    if len(idents) >= 2 and idents[-1] not in _C_KEYWORDS:
        name = idents.pop()
    base_text = " ".join(idents) if idents else "?"
    if opaque or not idents:
        base = "opaque"
    elif all(w in _C_KEYWORDS for w in idents):
        base = _canonical_keywords(idents)
    elif len(idents) == 1 and _strip_namespace(idents[0]) in TYPEDEFS:
        base = TYPEDEFS[_strip_namespace(idents[0])]
    elif len(idents) == 1 and depth > 0 and _strip_namespace(idents[0]) in VECTOR_ELEMENT:
        base = VECTOR_ELEMENT[_strip_namespace(idents[0])]
    else:
        base = "opaque"
    return CParam(index=index, name=name, decl=" ".join(text.split()), base=base, base_text=base_text,
                  pointer_depth=depth, is_const=is_const)


def _read_name_and_params(text: str, pos: int) -> tuple[str, int, int] | None:
    """From just after `__global__`, find the kernel name and the span of its parameter list."""
    last_ident = None
    k = pos
    while k < len(text):
        m = _SCAN.match(text, k)
        if m is None:
            return None
        tok = m.group(0)
        if tok == "(":
            if last_ident in _ATTRIBUTES_WITH_ARGS:
                end = _matching(text, k, "(", ")")
                if end < 0:
                    return None
                k, last_ident = end + 1, None
                continue
            if last_ident is None:
                return None
            end = _matching(text, k, "(", ")")
            return (last_ident, k + 1, end) if end >= 0 else None
        if tok in (";", "{", "}"):
            return None
        if not tok.isspace() and re.match(r"[A-Za-z_]", tok):
            last_ident = tok
        k = m.end()
    return None


def parse_kernel_signatures(source: str) -> dict[str, KernelSignature]:
    """All `__global__` functions of `source`, by name (first declaration wins).

    Kernels whose symbol can be looked up by name have `extern_c=True`; templates and C++-linkage
    kernels are listed too (with `extern_c=False`) so that errors can say why a name is missing.
    """
    text = _blank_comments_and_directives(source)
    blocks = _extern_c_blocks(text)
    found: dict[str, KernelSignature] = {}
    for m in re.finditer(r"\b__global__\b", text):
        parsed = _read_name_and_params(text, m.end())
        if parsed is None:
            continue
        name, p_start, p_end = parsed
        boundary = max(text.rfind(ch, 0, m.start()) for ch in ";{}")
        prefix = text[boundary + 1:m.start()]
        in_block = any(a <= m.start() < b for a, b in blocks)
        templated = re.search(r"\btemplate\b", prefix) is not None
        extern_c = (re.search(r'\bextern\s*"C"', prefix) is not None or in_block) and not templated
        raw_params = _split_top_level(text[p_start:p_end])
        if raw_params == ["void"]:
            raw_params = []
        params = tuple(parse_param(p, i) for i, p in enumerate(raw_params))
        if name not in found:
            found[name] = KernelSignature(name=name, params=params, extern_c=extern_c,
                                          line=text.count("\n", 0, m.start()) + 1)
    return found
