"""The profiled call in the candidate's runner: one forward under `torch.profiler`, as a `KernelProfile`.

The first profiled call in a process pays the profiler's start-up (about a second); the call itself is one
forward. The profiler may leave a native helper thread behind, so run it after the last guard check (or ignore
`guard.native_threads` for this phase). On a CPU device, or when the profiler cannot start (another profiler
active, no Kineto), the profile is empty and marked unavailable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from cudal1.eval.shared.kernel_profile import KernelProfile, KernelStat

logger = logging.getLogger(__name__)


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
