"""The candidate forms, named once, and which one a candidate's text is (decided from its content, never from a
file name).

- `kernel`: cudal1's kernel-only form, a JSON launch spec (CUDA source plus launches, no host code;
  `cudal1.kernel_form`, docs/kernel_form.md);
- `raw_cuda`: a Python module launching plain CUDA C through `cudal1.raw_cuda.load_kernels`;
- `load_inline`: a Python module building a KernelBench extension with `torch.utils.cpp_extension`;
- `torch`: a Python module with no CUDA of its own.
"""

from __future__ import annotations

import json
import re

KERNEL, RAW_CUDA, LOAD_INLINE, TORCH = "kernel", "raw_cuda", "load_inline", "torch"

#: The top-level fields of a kernel-form spec; a JSON object with any of them is taken for a (perhaps malformed)
#: spec, which the spec's parser then names the problem of.
SPEC_FIELDS = ("format", "source", "buffers", "steps", "options", "workspaces")
_SPEC_KEY = re.compile(r'"(?:format|steps)"\s*:')


def _parsed(text: str) -> tuple[str, dict | None] | None:
    """(the text past whitespace and a byte-order mark, its JSON object or None where it is not valid JSON), or
    None for a text that does not open with "{" (a Python module never does)."""
    body = text.lstrip("\ufeff \t\r\n")
    if not body.startswith("{"):
        return None
    try:
        return body, json.loads(body)  # (a JSON text that opens with "{" is an object)
    except (json.JSONDecodeError, RecursionError):
        return body, None


def is_kernel_form(text: str) -> bool:
    """Whether a candidate's text is a kernel-form spec rather than a Python module: a JSON object (after
    whitespace and a byte-order mark) with one of the spec's fields (`SPEC_FIELDS`), or a text that opens with "{"
    and holds a `"format":` or `"steps":` member but is not valid JSON (its JSON error is then the verdict). A
    Python module never starts with "{"; a JSON object without any spec field (`{"a": 1}`) is not taken for one."""
    parsed = _parsed(text)
    if parsed is None:
        return False
    body, data = parsed
    if data is None:
        return _SPEC_KEY.search(body) is not None
    return any(key in data for key in SPEC_FIELDS)


def kernel_spec_data(text: str) -> dict | None:
    """A kernel-form text's spec as a JSON object, else None (a module, or a spec that is not valid JSON)."""
    parsed = _parsed(text)
    data = parsed[1] if parsed is not None else None
    return data if data is not None and any(key in data for key in SPEC_FIELDS) else None


def _names_load_inline(text: str) -> bool:
    return "cpp_extension" in text or "load_inline" in text


def _names_raw_cuda(text: str) -> bool:
    return "load_kernels" in text or "cudal1.raw_cuda" in text


def uses_load_inline(text: str) -> bool:
    """Whether the candidate is a Python module that builds with `torch.utils.cpp_extension` (never a kernel-form
    spec, whatever its CUDA source's comments say)."""
    return _names_load_inline(text) and not is_kernel_form(text)


def launches_raw_cuda(text: str) -> bool:
    """Whether the candidate is in cudal1's raw-CUDA form (`cudal1.raw_cuda.load_kernels`), never a spec."""
    return _names_raw_cuda(text) and not is_kernel_form(text)


def candidate_form(text: str) -> str:
    """`kernel`, `load_inline`, `raw_cuda` or `torch` (no CUDA of its own) for a candidate's text."""
    if is_kernel_form(text):
        return KERNEL
    if _names_load_inline(text):
        return LOAD_INLINE
    if _names_raw_cuda(text):
        return RAW_CUDA
    return TORCH


__all__ = ["KERNEL", "LOAD_INLINE", "RAW_CUDA", "SPEC_FIELDS", "TORCH", "candidate_form", "is_kernel_form",
           "kernel_spec_data", "launches_raw_cuda", "uses_load_inline"]
