"""Errors of the raw-CUDA form, and the trimming of compiler logs into short LLM feedback.

`RawCudaCompileError` carries the trimmed log as its message (a few `file(line): error: ...` lines with
their source excerpt, warnings and remarks dropped) and the full log in `.log`. `RawCudaLaunchError`
names the kernel and the parameter at fault. Both derive from `cudal1.core.errors.Cudal1Error` so the CLI
prints them as one message, and the evaluator maps them to COMPILE_ERROR / RUNTIME_ERROR where raised.

Limits: the trimming understands the EDG diagnostics of NVRTC and nvcc (`kernel.cu(3): error: ...`),
gcc-style `file:3:5: error:` lines, and `ptxas`/`nvcc` fatal lines; any other log falls back to its
first non-empty lines.
"""

from __future__ import annotations

import re

from cudal1.core.errors import Cudal1Error

# Rationale: the trimmed log is fed back to an LLM; 15 lines hold about five errors with their source
# line and caret, which is enough to fix a kernel, and 1500 characters keep the prompt small.
MAX_LOG_LINES = 15
MAX_LOG_CHARS = 1500

_EDG_DIAG = re.compile(r"^(?P<loc>\S.*?)\((?P<line>\d+)\): (?P<kind>catastrophic error|error|warning|remark|note)"
                       r"\b")
_GCC_DIAG = re.compile(r"^(?P<loc>\S.*?):(?P<line>\d+):(?:\d+:)? (?P<kind>fatal error|error|warning|note)\b")
_TOOL_DIAG = re.compile(r"^(?:ptxas|nvcc|nvlink|nvrtc)\s*:?\s*(?P<kind>fatal|error|warning|info)\s*:",
                        re.IGNORECASE)
_SUMMARY = re.compile(r"^\d+ (?:catastrophic )?errors? detected in the compilation", re.IGNORECASE)
_ERROR_KINDS = {"error", "catastrophic error", "fatal error", "fatal"}


class RawCudaError(Cudal1Error):
    """Base class of the raw-CUDA form's errors."""


class RawCudaCompileError(RawCudaError):
    """The CUDA source did not compile; the message is the trimmed compiler log."""

    def __init__(self, message: str, log: str = "", compiler: str = ""):
        self.log = log
        self.compiler = compiler
        super().__init__(message)


class RawCudaLaunchError(RawCudaError):
    """A kernel could not be launched: bad arguments, launch configuration, or a driver error."""

    def __init__(self, message: str, kernel: str = "", param_index: int | None = None):
        self.kernel = kernel
        self.param_index = param_index
        super().__init__(message)


def _diagnostic_kind(line: str) -> str | None:
    """The kind of a diagnostic header line ('error', 'warning', ...), or None for other lines."""
    for pattern in (_EDG_DIAG, _GCC_DIAG, _TOOL_DIAG):
        m = pattern.match(line)
        if m:
            return m.group("kind").lower()
    return None


def _error_blocks(lines: list[str]) -> tuple[list[list[str]], str | None]:
    """Split a log into error blocks (header + up to two context lines) and the summary line."""
    blocks: list[list[str]] = []
    summary = None
    current: list[str] | None = None
    for raw in lines:
        line = raw.rstrip()
        kind = _diagnostic_kind(line)
        if kind is not None:
            current = [line] if kind in _ERROR_KINDS else None
            if current is not None:
                blocks.append(current)
        elif _SUMMARY.match(line.strip()):
            summary = line.strip()
            current = None
        elif not line.strip():
            current = None
        elif current is not None and len(current) < 3:
            current.append(line)  # the source excerpt and the caret under it
    return blocks, summary


def trim_compile_log(log: str, max_lines: int = MAX_LOG_LINES, max_chars: int = MAX_LOG_CHARS) -> str:
    """Keep the first errors of a compiler log (with their source line and caret), drop the rest.

    Warnings, remarks and notes are dropped with their excerpts. When the log holds no recognizable
    error line, its first non-empty lines are kept instead. The result has at most `max_lines` lines and
    about `max_chars` characters, and says how many errors were left out.
    """
    lines = log.replace("\x00", "").splitlines()
    blocks, summary = _error_blocks(lines)
    if not blocks:
        kept = [ln.rstrip() for ln in lines if ln.strip()][:max_lines]
        return _cap_chars("\n".join(kept), max_chars)
    out: list[str] = []
    used_blocks = 0
    for block in blocks:
        if out and len(out) + len(block) > max_lines - 1:
            break
        out.extend(block[: max(1, max_lines - 1 - len(out))])
        used_blocks += 1
    left = len(blocks) - used_blocks
    if left:
        out.append(f"... {left} more error(s) not shown")
    elif summary and len(out) < max_lines:
        out.append(summary)
    return _cap_chars("\n".join(out), max_chars)


def _cap_chars(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 20]
    cut = cut[: cut.rfind("\n")] if "\n" in cut else cut
    return cut + "\n... (log truncated)"
