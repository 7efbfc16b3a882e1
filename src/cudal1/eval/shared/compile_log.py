"""Compiler logs made short: the few lines that explain a failed build, for users and for LLM feedback.

`trim_compiler_log(text)` keeps error lines (gcc, g++, nvcc, ld and Python syntax errors as torch's ninja
build prints them) with a little source context, drops command lines, include stacks, warnings and notes,
shortens absolute paths, and fits the result into a line and character budget; `build_failure_message(log)`
is its first error line, the one-line message of a compile error verdict.
"""

from __future__ import annotations

import re

# Rationale: these lines say what went wrong; gcc/g++/nvcc/ld formats as printed by torch's ninja build.
_KEEP_PATTERNS = re.compile(
    r"(\berror\b\s*:|\berror\s+#|\berror\s|fatal error|undefined reference|undefined symbol|"
    r"cannot find -l|multiple definition|ninja: build stopped|errors? detected in the compilation)",
    re.IGNORECASE)
# Rationale: noise for an LLM: ninja command lines, include stacks, warnings, notes, progress lines.
_DROP_PATTERNS = re.compile(
    r"^\s*(\[\d+/\d+\]|FAILED:|In file included from|from\s+\S+[:,]|ninja: (?:no work|entering)|"
    r"\S*(?:c\+\+|g\+\+|gcc|clang\+?\+?|nvcc|cicc|ptxas)(?:\s|$)|"
    r"\S+:\s+In (?:function|member function|instantiation|constructor|static member)|"
    r"Remark|Emitting|detected during|required from|Traceback|File \")")
_WARNING_OR_NOTE = re.compile(r"\b(warning|note|remark)\b\s*[:#]", re.IGNORECASE)
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b(: .*)?$")
# Absolute paths only (not the `cub/block/x.cuh` of an include directive).
_PATH = re.compile(r"(?<![\w.\-/])(?:/[^\s:'\"()<>\[\],/]+)+/([^/\s:'\"()<>\[\],]+)")
_BUILD_ERROR_HEAD = re.compile(r"(Error building extension '[^']*')\s*:?.*")
_SOURCE_CONTEXT_LINES = 2


def _shorten_paths(line: str) -> str:
    return _PATH.sub(r"\1", line)


def _is_context_line(line: str) -> bool:
    """A source excerpt printed after an error: indented code, a gcc `  12 | code`, or a caret line."""
    if not line.strip() or _KEEP_PATTERNS.search(line) or _WARNING_OR_NOTE.search(line):
        return False
    return line.startswith((" ", "\t")) or bool(re.match(r"^\s*\d*\s*\|", line))


_PYTHON_SYNTAX_ERROR = re.compile(r"(?:SyntaxError|IndentationError|TabError): (.*?)(?: \([^,()]*, line (\d+)\))?$")


def build_failure_message(log: str, limit: int = 300) -> str:
    """One line for a failed build: the first compiler error in `log`, else its first line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    first_error = next((ln for ln in lines if _KEEP_PATTERNS.search(ln) and not _BUILD_ERROR_HEAD.search(ln)
                        and "ninja: build stopped" not in ln), None)
    syntax = _PYTHON_SYNTAX_ERROR.match(lines[0]) if first_error is None and lines else None
    if syntax:  # the module never reached a compiler; worded as the runner words it
        where = f" at line {syntax.group(2)}" if syntax.group(2) else ""
        return f"syntax error{where}: {syntax.group(1)}"[:limit]
    return "CUDA build failed: " + (first_error or (lines[0] if lines else "no compiler output"))[:limit]


def trim_compiler_log(text: str, max_lines: int = 20, max_chars: int = 2000) -> str:
    """The first meaningful messages of a failed build, short enough to feed back to an LLM.

    Keeps error lines (`error:`, `fatal error`, `undefined reference`, linker errors) with the 1-2 lines of
    source context compilers print after them, `ninja: build stopped`, torch's "Error building extension"
    head and the final Python exception line; drops ninja command lines, include stacks, warnings and
    notes; rewrites absolute paths to their basename. Falls back to the last lines when nothing matches.
    """
    lines = [ln.rstrip() for ln in text.replace("\r", "").splitlines()]
    head: list[str] = []
    kept: list[str] = []
    tail: list[str] = []
    context_left = 0
    for line in lines:
        head_match = _BUILD_ERROR_HEAD.search(line)
        if head_match and not head:
            head.append(head_match.group(1))
            continue
        if context_left and _is_context_line(line):
            kept.append(_shorten_paths(line))
            context_left -= 1
            continue
        context_left = 0
        if _DROP_PATTERNS.match(line) or _WARNING_OR_NOTE.search(line):
            continue
        if "ninja: build stopped" in line:
            tail = [line.strip()]
        elif _KEEP_PATTERNS.search(line):
            kept.append(_shorten_paths(line.strip()))
            context_left = _SOURCE_CONTEXT_LINES
    last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
    if _EXC_LINE.match(last) and not _BUILD_ERROR_HEAD.search(last):
        last = _shorten_paths(last)
        kept = [ln for ln in kept if ln != last]
        tail.append(last)
    if not kept and not head and not tail:
        kept = [_shorten_paths(ln) for ln in lines if ln.strip() and not _DROP_PATTERNS.match(ln)][-max_lines:]
    return _fit(head, _dedupe(kept), tail, max_lines, max_chars)


def _dedupe(lines: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for line in lines:
        if line.strip() and _KEEP_PATTERNS.search(line):
            if line in seen:
                continue
            seen.add(line)
        out.append(line)
    return out


def _fit(head: list[str], body: list[str], tail: list[str], max_lines: int, max_chars: int) -> str:
    """Join head + body + tail within the line and character budgets (head and tail always kept)."""
    room = max(0, max_lines - len(head) - len(tail))
    dropped = max(0, len(body) - room)
    body = body[:room]
    if dropped and body:
        body[-1] = f"... ({dropped + 1} more lines)"
    out = "\n".join(head + body + tail)
    while len(out) > max_chars and body:
        body.pop()
        out = "\n".join(head + body + ["..."] + tail)
    return out[:max_chars]
