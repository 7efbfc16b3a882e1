"""What one profiled call ran on the GPU (`KernelProfile`), and how kernel names are read.

Produced in the candidate's runner (`inside.profiling.profile_call`), judged by the parent (`decoys.py`).
Name matching handles Itanium-mangled names (`_Z11relu_kernelPKfPfi`), demangled ones with return types,
namespaces and template arguments (`void (anonymous namespace)::relu_kernel<float>(float const*, ...)`),
`extern "C"` names, and Triton's (`relu_kernel`, or `relu_kernel_0d1d2de` from Triton <= 2.1). Kernels in
library namespaces (`at::`, `cutlass::`, `cub::`, ...) never count as the candidate's own, even when the
base names coincide.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Rationale: kernels of these namespaces belong to PyTorch and the CUDA libraries; a candidate kernel that
# happens to share a base name (`elementwise_kernel`) with one of them must not make it look custom.
LIBRARY_NAMESPACES = frozenset({"at", "c10", "cub", "cuda", "cudnn", "cublas", "cublasLt", "cutlass", "cute",
                                "flash", "std", "thrust", "torch", "triton", "xformers"})

# Rationale: Triton up to 2.1 appended the argument specialization to the kernel name (`_0d1d2de`:
# argument index, then d = divisible by 16, c = constant, e = equal to 1).
TRITON_SUFFIX = re.compile(r"\d[0-9cde]*")


@dataclass(frozen=True)
class KernelStat:
    """GPU activity of one name in a profile."""

    name: str  # as the profiler reports it (usually demangled)
    calls: int
    total_us: float
    kind: str = "kernel"  # "kernel" | "memcpy" | "memset"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "calls": self.calls, "total_us": self.total_us, "kind": self.kind}


@dataclass(frozen=True)
class KernelProfile:
    """What one profiled call ran on the GPU."""

    kernels: list[KernelStat] = field(default_factory=list)  # sorted by total_us, largest first
    device: str = "cpu"
    available: bool = True  # False when the profiler could not run (then `kernels` is empty)
    note: str = ""  # why it is unavailable, or other remarks
    wall_ms: float | None = None  # wall time of the profiled call (profiler overhead included)

    @property
    def total_us(self) -> float:
        """GPU time of all recorded activity (kernels, copies, memsets)."""
        return sum(k.total_us for k in self.kernels)

    @property
    def kernel_calls(self) -> int:
        return sum(k.calls for k in self.kernels)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (`total_us` included for readers that do not recompute it)."""
        return {"kernels": [k.to_dict() for k in self.kernels], "total_us": self.total_us,
                "device": self.device, "available": self.available, "note": self.note,
                "wall_ms": self.wall_ms}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelProfile:
        return cls(kernels=[KernelStat(**k) for k in d.get("kernels", [])], device=d.get("device", "cpu"),
                   available=bool(d.get("available", True)), note=d.get("note", ""), wall_ms=d.get("wall_ms"))

    def describe(self, top: int = 3) -> str:
        """One line: how many kernels, the GPU time, and the largest few with their shares."""
        if not self.available:
            return f"profile unavailable on {self.device}: {self.note or 'no reason given'}"
        if not self.kernels:
            return f"no GPU activity recorded on {self.device}"
        total = self.total_us
        parts = [f"{short_name(k.name) if k.kind == 'kernel' else k.name} "
                 f"{100.0 * k.total_us / total:.0f}% ({k.calls}x)" for k in self.kernels[:top]]
        more = f", +{len(self.kernels) - top} more" if len(self.kernels) > top else ""
        return (f"{len(self.kernels)} GPU kernels/ops, {self.kernel_calls} calls, {total:.1f} us: "
                + ", ".join(parts) + more)


# ----------------------------------------------------------------------------------------------------
# Names
# ----------------------------------------------------------------------------------------------------

def _demangle(symbol: str) -> str:
    """Demangle with PyTorch's demangler; fall back to reading the leading names of the Itanium symbol."""
    try:
        import torch

        text = torch._C._demangle(symbol)
    except (ImportError, AttributeError, RuntimeError):
        text = symbol
    if text and not text.startswith("_Z"):
        return text
    return "::".join(_itanium_names(symbol))


def _itanium_names(symbol: str) -> list[str]:
    """The (nested) source names at the start of an Itanium symbol: `_ZN3foo3barE...` -> [foo, bar]."""
    i = 2 + int(symbol.startswith("_ZL"))
    nested = symbol[i:i + 1] == "N"
    if nested:
        i += 1
        while i < len(symbol) and symbol[i] in "rVK":  # cv-qualifiers of a member function
            i += 1
    names: list[str] = []
    while i < len(symbol):
        m = re.match(r"\d+", symbol[i:])
        if not m:
            break
        length, i = int(m.group()), i + len(m.group())
        names.append(symbol[i:i + length])
        i += length
        if not nested:
            break
    return names


def _strip_templates(text: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def split_kernel_name(name: str) -> tuple[str, str]:
    """(qualifier, base identifier) of a profiler kernel name, mangled or demangled.

    `void (anonymous namespace)::relu_kernel<float>(float const*, float*, int)` -> ("{anon}", "relu_kernel");
    `_Z11relu_kernelPKfPfi` -> ("", "relu_kernel"); `at::native::foo<4>(...)` -> ("at::native", "foo").
    """
    text = name.strip()
    if text.startswith("_Z"):
        text = _demangle(text)
    text = text.replace("(anonymous namespace)", "{anon}")
    depth, cut = 0, len(text)
    for i, ch in enumerate(text):  # the argument list starts at the first "(" outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            cut = i
            break
    words = _strip_templates(text[:cut]).split()
    parts = [p for p in (words[-1] if words else "").split("::") if p]
    if not parts:
        return "", ""
    return "::".join(parts[:-1]), parts[-1]


def short_name(name: str) -> str:
    """A readable short form of a kernel name: qualifier and base, no arguments or templates."""
    qualifier, base = split_kernel_name(name)
    if not base:
        return name[:60]
    return f"{qualifier}::{base}" if qualifier else base


def _is_library(qualifier: str) -> bool:
    first = qualifier.split("::", 1)[0]
    return first in LIBRARY_NAMESPACES


def kernel_matches(profiled_name: str, own_name: str) -> bool:
    """True when the profiler's `profiled_name` is the candidate kernel `own_name` (see module docstring)."""
    own = own_name.strip().rsplit("::", 1)[-1]
    if not own:
        return False
    qualifier, base = split_kernel_name(profiled_name)
    if _is_library(qualifier):
        return False
    if base == own:
        return True
    return base.startswith(own + "_") and TRITON_SUFFIX.fullmatch(base[len(own) + 1:]) is not None
