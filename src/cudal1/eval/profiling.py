"""Which GPU kernels a candidate's forward really runs: one profiled call, and the decoy-kernel guard.

`profile_call(fn, device)` runs `fn` once under `torch.profiler` (CPU + CUDA activities) and returns a
`KernelProfile`: per kernel name the calls and the GPU time, plus copies and memsets, and the total.
`own_kernel_share(profile, own_names)` is the fraction of that GPU time spent in the candidate's own
kernels (the `__global__` kernels static analysis found, its Triton kernels, the raw-CUDA kernels it
loaded). `decoy_flags(profile, static_report)` turns that into guard flags for a candidate classified as
custom CUDA or Triton:

- `guard.decoy_kernel` (WARNING): GPU kernels ran, but none of the candidate's own; the work was done by
  PyTorch/cuBLAS/cuDNN. Policy: reclassify as not custom (`reclassify`), do not reject.
- `guard.low_custom_share` (INFO): its kernels ran but took less than `min_share` of the GPU time.
- `guard.kernels_not_run` (INFO): some defined kernels never ran (alternatives, dead code, decoys).
- `guard.no_gpu_work` (INFO): the profiled forward ran no GPU work at all (cached results, or a profiler
  that recorded nothing; the two cannot be told apart here, so it only informs).

Name matching handles Itanium-mangled names (`_Z11relu_kernelPKfPfi`), demangled ones with return types,
namespaces and template arguments (`void (anonymous namespace)::relu_kernel<float>(float const*, ...)`),
`extern "C"` names, and Triton's (`relu_kernel`, or `relu_kernel_0d1d2de` from Triton <= 2.1). Kernels in
library namespaces (`at::`, `cutlass::`, `cub::`, ...) never count as the candidate's own, even when the
base names coincide.

Limits: on a CPU device, or when the profiler cannot start (another profiler active, no Kineto), the
profile is empty and marked unavailable, and no flag is raised. GPU time is the sum of kernel durations,
so kernels overlapping on several streams can sum to more than the wall time; shares stay meaningful.
The first profiled call in a process pays the profiler's start-up (about a second); the call itself is
one forward. The profiler may leave a native helper thread behind, so run it after the last guard check
(or ignore `guard.native_threads` for this phase).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cudal1.core import flags as F
from cudal1.core.types import CUSTOM_CLASSES, Flag, KernelClass, Severity

__all__ = [
    "DEFAULT_MIN_OWN_SHARE",
    "KernelProfile",
    "KernelStat",
    "decoy_flags",
    "kernel_matches",
    "own_kernel_names",
    "own_kernel_share",
    "profile_call",
    "reclassify",
    "split_kernel_name",
]

logger = logging.getLogger(__name__)

# Rationale: an honest custom kernel usually does most of the work; below 10% of the GPU time the speedup
# comes from something else (cuBLAS, a PyTorch rewrite), which is worth noting but is no proof of cheating.
DEFAULT_MIN_OWN_SHARE = 0.10

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


def own_kernel_names(static_report: Any = None, raw_kernel_names: Iterable[str] = ()) -> list[str]:
    """The candidate's own kernel names: static `kernels_defined`, Triton kernels, raw-CUDA kernels."""
    names: dict[str, None] = {}
    if static_report is not None:
        for attr in ("kernels_defined", "triton_kernels_defined"):
            names.update(dict.fromkeys(getattr(static_report, attr, None) or []))
    names.update(dict.fromkeys(raw_kernel_names))
    return [n for n in names if n]


def _own_stats(profile: KernelProfile, own_names: Sequence[str]) -> list[KernelStat]:
    return [k for k in profile.kernels
            if k.kind == "kernel" and any(kernel_matches(k.name, o) for o in own_names)]


def own_kernel_share(profile: KernelProfile, own_names: Iterable[str]) -> float:
    """Fraction of the profile's GPU time spent in kernels matching `own_names` (0.0 when nothing ran)."""
    total = profile.total_us
    if total <= 0:
        return 0.0
    own = _own_stats(profile, list(own_names))
    return min(1.0, sum(k.total_us for k in own) / total)


def never_ran(profile: KernelProfile, own_names: Iterable[str]) -> list[str]:
    """The names in `own_names` that match no kernel of the profile."""
    return [o for o in own_names if not any(kernel_matches(k.name, o) for k in profile.kernels)]


# ----------------------------------------------------------------------------------------------------
# Profiling
# ----------------------------------------------------------------------------------------------------

def _device_type(device: Any) -> str:
    return str(getattr(device, "type", device)).split(":", 1)[0]


def _is_gpu_event(evt: Any) -> str | None:
    """The kind ("kernel" | "memcpy" | "memset") of a profiler event that occupies the GPU, else None.

    Kineto's GPU-side activities are "kernel", "gpu_memcpy", "gpu_memset" and "gpu_user_annotation"; the
    annotations (record_function ranges projected onto the GPU timeline) overlap kernels and are left out.
    """
    if "CUDA" not in str(getattr(evt, "device_type", "")):
        return None
    if getattr(evt, "is_user_annotation", False):
        return None
    activity = str(getattr(evt, "activity_type", None) or "").lower()  # absent before PyTorch 2.5 or so
    if "annotation" in activity:
        return None
    for word in ("memcpy", "memset"):
        if word in activity:
            return word
    return "kernel"  # "kernel", "concurrent_kernel", or no activity type: a CUDA-side event is GPU work


def profile_from_events(events: Iterable[Any], device: str, wall_ms: float | None = None) -> KernelProfile:
    """Aggregate profiler events (`prof.events()`) into a KernelProfile; only GPU-side activity counts."""
    acc: dict[tuple[str, str], list[float]] = {}
    for evt in events:
        kind = _is_gpu_event(evt)
        if kind is None:
            continue
        duration_us = float(evt.time_range.elapsed_us())
        entry = acc.setdefault((evt.name, kind), [0, 0.0])
        entry[0] += 1
        entry[1] += max(0.0, duration_us)
    stats = [KernelStat(name, int(calls), total, kind) for (name, kind), (calls, total) in acc.items()]
    stats.sort(key=lambda k: (-k.total_us, k.name))
    return KernelProfile(kernels=stats, device=device, wall_ms=wall_ms)


def profile_call(fn: Callable[[], Any], device: Any) -> KernelProfile:
    """Run `fn()` once under `torch.profiler` and return what ran on the GPU.

    On a CPU device the call is still profiled (CPU activity only) and the profile has no kernels. When
    the profiler cannot start or stop, the profile is marked unavailable; exceptions raised by `fn`
    itself propagate (they are the candidate's).
    """
    import torch

    dev = _device_type(device)
    try:
        from torch.profiler import ProfilerActivity, profile, supported_activities

        activities = [ProfilerActivity.CPU]
        if dev == "cuda" and ProfilerActivity.CUDA in supported_activities():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, record_shapes=False, with_stack=False)
        prof.start()
    except Exception as exc:  # noqa: BLE001 - an unusable profiler must never fail the evaluation
        logger.warning("profiler unavailable: %s", exc)
        return KernelProfile(device=dev, available=False, note=f"profiler did not start: {exc}"[:200])
    events: list[Any] | None = None
    note = ""
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            fn()
        if dev == "cuda":
            torch.cuda.synchronize(device)
    finally:
        wall_ms = (time.perf_counter() - t0) * 1e3
        try:
            prof.stop()
            events = list(prof.events() or [])
        except Exception as exc:  # noqa: BLE001
            logger.warning("profiler failed to stop or report: %s", exc)
            note = f"profiler failed: {exc}"[:200]
    if events is None:
        return KernelProfile(device=dev, available=False, note=note, wall_ms=wall_ms)
    if dev == "cuda" and len(activities) == 1:
        return KernelProfile(device=dev, available=False, note="CUDA activity profiling is not supported",
                             wall_ms=wall_ms)
    return profile_from_events(events, dev, wall_ms)


# ----------------------------------------------------------------------------------------------------
# The decoy guard
# ----------------------------------------------------------------------------------------------------

def _names(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def decoy_flags(profile: KernelProfile, static_report: Any, kernel_class: KernelClass | str | None = None, *,
                raw_kernel_names: Iterable[str] = (), min_share: float = DEFAULT_MIN_OWN_SHARE) -> list[Flag]:
    """Runtime flags for a custom CUDA/Triton candidate whose own kernels did not (really) run.

    `static_report` is the candidate's `StaticReport` (or anything with `kernels_defined` and
    `triton_kernels_defined`); `kernel_class` defaults to its class; `raw_kernel_names` adds the kernels of
    the raw-CUDA launch log (`launch_log().defined_kernels`). Candidates of other classes, unavailable
    profiles and CPU profiles give no flags.
    """
    if not 0.0 <= min_share <= 1.0:
        raise ValueError(f"min_share must be in [0, 1], got {min_share}")
    cls = kernel_class if kernel_class is not None else getattr(static_report, "kernel_class", None)
    if cls is None or KernelClass(cls) not in CUSTOM_CLASSES:
        return []
    if not profile.available or profile.device != "cuda":
        return []
    if not profile.kernels:
        return [Flag(F.NO_GPU_WORK, Severity.INFO, "the profiled forward ran no GPU kernels",
                     source="runtime")]
    own = own_kernel_names(static_report, raw_kernel_names)
    if not own:
        return []  # nothing named to look for (e.g. inline PTX only): cannot tell
    missing = never_ran(profile, own)
    ran = [o for o in own if o not in missing]
    top = short_name(profile.kernels[0].name)
    if not ran:
        return [Flag(F.DECOY_KERNEL, Severity.WARNING,
                     f"none of the candidate's kernels ({_names(own)}) ran in the forward; "
                     f"the GPU time went to {top} and {len(profile.kernels) - 1} other kernel(s)",
                     source="runtime")]
    flags = []
    share = own_kernel_share(profile, own)
    if share < min_share:
        flags.append(Flag(F.LOW_CUSTOM_SHARE, Severity.INFO,
                          f"the candidate's kernels took {100 * share:.1f}% of the forward's GPU time "
                          f"(below {100 * min_share:.0f}%); most went to {top}", source="runtime"))
    if missing:
        flags.append(Flag(F.KERNELS_NOT_RUN, Severity.INFO,
                          f"defined but not run in the forward: {_names(missing)}", source="runtime"))
    return flags


def reclassify(kernel_class: KernelClass | str | None, flags: Iterable[Flag]) -> KernelClass | None:
    """The class after the runtime guards: a decoy custom candidate is PyTorch-only (not rejected)."""
    if kernel_class is None:
        return None
    cls = KernelClass(kernel_class)
    if cls in CUSTOM_CLASSES and any(f.rule == F.DECOY_KERNEL for f in flags):
        return KernelClass.PYTORCH_ONLY
    return cls
