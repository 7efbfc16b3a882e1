"""A light tokenizer and scanner for the CUDA/C++ source strings a candidate compiles.

What it finds, without a real C++ parser:
- `__global__` kernels (name and line), template and `__launch_bounds__` forms included;
- top-level host functions and, for each, the kernels it launches with `<<<...>>>` (with the launch
  configuration split into its arguments, so the 4th one, the stream, can be checked) and the other
  functions it calls;
- names exported to Python through `PYBIND11_MODULE` / `m.def("name", ...)`;
- every identifier token with its line, so rules can look for API names (`cudaStreamCreate`, `__half`).

Comments and string literals are blanked out before scanning (their newlines kept, so line numbers stay
right); string literal values are still available as `string` tokens, which `m.def` needs.

Limits: the preprocessor is ignored (macros are not expanded, `#if 0` blocks are scanned), lambdas and
nested classes are scanned as part of the function that holds them, and `operator<<<` tricks or kernels
launched through `cudaLaunchKernel` with a computed function pointer are not resolved (the latter are
recorded by their first argument's identifier when it is one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "CToken",
    "CudaLaunch",
    "CudaSourceInfo",
    "scan_cuda_source",
    "strip_comments_and_strings",
    "tokenize_c",
]

_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER_RE = re.compile(
    r"(?:0[xX][0-9a-fA-F']+|\d[\d']*\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)[uUlLfF]*"
)
# Longest operators first so `<<<` wins over `<<` and `<`.
_PUNCTS = (
    "<<<",
    ">>>",
    "->",
    "::",
    "<<",
    ">>",
    "<=",
    ">=",
    "==",
    "!=",
    "&&",
    "||",
    "++",
    "--",
    "+=",
    "-=",
    "*=",
    "/=",
)
_TRANSPARENT_SCOPES = {"namespace", "extern"}


@dataclass(frozen=True)
class CToken:
    """One token: kind is 'ident', 'number', 'punct' or 'string' (value holds the literal's body)."""

    kind: str
    value: str
    line: int  # 1-based, within the CUDA string


@dataclass(frozen=True)
class CudaLaunch:
    """A `kernel<<<grid, block[, smem[, stream]]>>>(...)` launch."""

    kernel: str
    config: tuple[str, ...]  # the launch configuration arguments, as source text
    line: int
    host_function: str | None  # top-level function that contains the launch

    @property
    def stream_arg(self) -> str | None:
        return self.config[3] if len(self.config) >= 4 else None


@dataclass
class CudaSourceInfo:
    """What one CUDA/C++ source string defines, launches and exports."""

    kernels: dict[str, int] = field(default_factory=dict)  # __global__ name -> line
    launches: list[CudaLaunch] = field(default_factory=list)
    host_functions: dict[str, int] = field(default_factory=dict)  # name -> line
    host_calls: dict[str, set[str]] = field(default_factory=dict)  # host function -> identifiers called
    pybind_exports: dict[str, str] = field(default_factory=dict)  # python name -> C++ function
    tokens: list[CToken] = field(default_factory=list)
    has_inline_asm: bool = False

    def idents(self) -> dict[str, int]:
        """First line of every identifier in the source."""
        seen: dict[str, int] = {}
        for tok in self.tokens:
            if tok.kind == "ident" and tok.value not in seen:
                seen[tok.value] = tok.line
        return seen

    def kernels_reachable_from(self, roots: set[str]) -> set[str]:
        """Kernels launched (transitively through host calls) from the given host functions."""
        todo, done = list(roots), set()
        while todo:
            fn = todo.pop()
            if fn in done:
                continue
            done.add(fn)
            todo.extend(c for c in self.host_calls.get(fn, ()) if c in self.host_functions)
        return {launch.kernel for launch in self.launches if launch.host_function in done}


def strip_comments_and_strings(text: str) -> str:
    """Blank out comments and string/char literals, keeping every newline and the text length."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = _end_of_literal(text, i)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1 : j - 1]) + c if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _end_of_literal(text: str, start: int) -> int:
    """Index just past the string or char literal opening at `start` (stops at an unescaped newline)."""
    quote, i, n = text[start], start + 1, len(text)
    while i < n:
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        if text[i] == "\n":
            return i
        i += 1
    return n


def tokenize_c(text: str) -> list[CToken]:
    """Tokenize C/C++/CUDA source; comments are dropped, literals become 'string' tokens."""
    tokens: list[CToken] = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            line += text.count("\n", i, j)
            i = j
        elif c in "\"'":
            j = _end_of_literal(text, i)
            tokens.append(CToken("string", text[i + 1 : max(i + 1, j - 1)], line))
            line += text.count("\n", i, j)
            i = j
        elif c == "#" and _at_line_start(text, i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            tokens.append(CToken("punct", "#", line))
            i += 1
        else:
            i = _read_token(text, i, line, tokens)
    return tokens


def _at_line_start(text: str, i: int) -> bool:
    k = i - 1
    while k >= 0 and text[k] in " \t":
        k -= 1
    return k < 0 or text[k] == "\n"


def _read_token(text: str, i: int, line: int, tokens: list[CToken]) -> int:
    m = _IDENT_RE.match(text, i)
    if m:
        tokens.append(CToken("ident", m.group(), line))
        return m.end()
    m = _NUMBER_RE.match(text, i)
    if m and m.end() > i:
        tokens.append(CToken("number", m.group(), line))
        return m.end()
    for p in _PUNCTS:
        if text.startswith(p, i):
            tokens.append(CToken("punct", p, line))
            return i + len(p)
    tokens.append(CToken("punct", text[i], line))
    return i + 1


def _match_forward(tokens: list[CToken], i: int, open_: str, close: str) -> int:
    """Index of the token closing the bracket opened at `i` (or len(tokens))."""
    depth = 0
    for j in range(i, len(tokens)):
        v = tokens[j].value if tokens[j].kind == "punct" else None
        if v == open_:
            depth += 1
        elif v == close:
            depth -= 1
            if depth == 0:
                return j
    return len(tokens)


def _match_backward(tokens: list[CToken], i: int, open_: str, close: str) -> int:
    """Index of the token opening the bracket closed at `i` (or -1)."""
    depth = 0
    for j in range(i, -1, -1):
        v = tokens[j].value if tokens[j].kind == "punct" else None
        if v == close:
            depth += 1
        elif v == open_:
            depth -= 1
            if depth == 0:
                return j
    return -1


def _kernel_name_after(tokens: list[CToken], i: int) -> str | None:
    """Name of the kernel whose declaration follows the `__global__` token at `i`."""
    j, last_ident = i + 1, None
    while j < len(tokens) and j < i + 60:
        tok = tokens[j]
        if tok.kind == "ident" and tok.value == "__launch_bounds__":
            j = _match_forward(tokens, j + 1, "(", ")") + 1
            continue
        if tok.kind == "punct" and tok.value == "(":
            return last_ident
        if tok.kind == "punct" and tok.value in (";", "{"):
            return None
        if tok.kind == "ident":
            last_ident = tok.value
        j += 1
    return None


def _split_top_level(tokens: list[CToken]) -> tuple[str, ...]:
    parts: list[list[str]] = [[]]
    depth = 0
    for tok in tokens:
        if tok.kind == "punct" and tok.value in "([{":
            depth += 1
        elif tok.kind == "punct" and tok.value in ")]}":
            depth -= 1
        if tok.kind == "punct" and tok.value == "," and depth == 0:
            parts.append([])
            continue
        parts[-1].append(tok.value if tok.kind != "string" else f'"{tok.value}"')
    return tuple("".join(_join(p)) for p in parts if p)


def _join(values: list[str]) -> list[str]:
    out: list[str] = []
    for v in values:
        if out and _IDENT_RE.fullmatch(v) and _IDENT_RE.fullmatch(out[-1][-1:] or "-"):
            out.append(" ")
        out.append(v)
    return out


def _launch_at(tokens: list[CToken], i: int, host: str | None) -> CudaLaunch | None:
    """Parse a launch whose `<<<` token is at index `i`."""
    k = i - 1
    if k >= 0 and tokens[k].value == ">":
        k = _match_backward(tokens, k, "<", ">") - 1
    if k < 0 or tokens[k].kind != "ident":
        return None
    end = next((j for j in range(i + 1, min(len(tokens), i + 200)) if tokens[j].value == ">>>"), None)
    if end is None:
        return None
    return CudaLaunch(
        kernel=tokens[k].value,
        config=_split_top_level(tokens[i + 1 : end]),
        line=tokens[i].line,
        host_function=host,
    )


def _function_header(tokens: list[CToken], brace: int) -> str | None:
    """If the `{` at index `brace` opens a function body, the function's name."""
    k = brace - 1
    while k >= 0 and tokens[k].kind == "ident" and tokens[k].value in ("const", "noexcept", "override"):
        k -= 1
    if k < 0 or tokens[k].value != ")":
        return None
    k = _match_backward(tokens, k, "(", ")") - 1
    if k >= 0 and tokens[k].kind == "ident" and tokens[k].value not in ("if", "for", "while", "switch"):
        return tokens[k].value
    return None


def _is_transparent_scope(tokens: list[CToken], brace: int) -> bool:
    """`namespace x {`, `extern "C" {` : scopes whose contents are still top level."""
    for k in range(brace - 1, max(-1, brace - 4), -1):
        if tokens[k].kind == "ident" and tokens[k].value in _TRANSPARENT_SCOPES:
            return True
        if tokens[k].kind == "punct":
            return False
    return False


def scan_cuda_source(text: str) -> CudaSourceInfo:
    """Scan one CUDA/C++ source string: kernels, host functions, launches, pybind exports."""
    tokens = tokenize_c(text)
    info = CudaSourceInfo(tokens=tokens)
    stack: list[str | None] = []  # per open brace: function name, "" for a plain block, None if transparent
    current: str | None = None
    for i, tok in enumerate(tokens):
        v = tok.value
        if tok.kind == "ident":
            if v == "__global__":
                name = _kernel_name_after(tokens, i)
                if name and name not in info.kernels:
                    info.kernels[name] = tok.line
            elif v in ("asm", "__asm__") and i + 1 < len(tokens) and tokens[i + 1].value in ("(", "volatile"):
                info.has_inline_asm = True
            elif current and i + 1 < len(tokens) and tokens[i + 1].value == "(":
                info.host_calls.setdefault(current, set()).add(v)
        elif tok.kind == "punct" and v == "<<<":
            launch = _launch_at(tokens, i, current)
            if launch:
                info.launches.append(launch)
                if current:
                    info.host_calls.setdefault(current, set()).add(launch.kernel)
        elif tok.kind == "punct" and v == "{":
            depth = sum(1 for s in stack if s is not None)
            name = _function_header(tokens, i) if depth == 0 else None
            if depth == 0 and name is None and _is_transparent_scope(tokens, i):
                stack.append(None)
                continue
            stack.append(name or "")
            if name and name not in info.kernels:
                info.host_functions.setdefault(name, tok.line)
                current = name
        elif tok.kind == "punct" and v == "}" and stack:
            stack.pop()
            if not any(s for s in stack):
                current = None
    _scan_pybind(tokens, info)
    return info


def _scan_pybind(tokens: list[CToken], info: CudaSourceInfo) -> None:
    """Record `m.def("py_name", &cpp_fn, ...)` exports."""
    for i in range(len(tokens) - 4):
        if tokens[i].value == "def" and tokens[i - 1].value in (".", "->") and tokens[i + 1].value == "(":
            if tokens[i + 2].kind != "string":
                continue
            py_name = tokens[i + 2].value
            target = py_name
            for j in range(i + 3, min(len(tokens), i + 8)):
                if tokens[j].kind == "ident" and tokens[j].value not in ("torch", "at", "py"):
                    target = tokens[j].value
                    break
            info.pybind_exports[py_name] = target
