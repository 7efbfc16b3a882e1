"""Runtime guards: what a candidate must not change in the worker process, checked around its code.

Covered: global numeric state (TF32 switches, cuDNN benchmark/deterministic/enabled, float32 matmul
precision, default dtype, deterministic algorithms, flush-denormal, intra-op thread count), the number of
live threads (Python and native, from /proc), and the identity of the functions the harness times and
compares with (CUDA events, synchronize, streams, perf_counter, allclose...). `restore` puts the global
state back, so a candidate's flag change can never speed up or slow down the reference.
Not covered: state inside C++ extensions, environment variables read later by libraries, and anything
that re-patches the functions *after* the check and before the harness calls them (the worker checks
again after every phase).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from cudal1.eval.types import Flag, Severity


def _timing_functions() -> dict[str, Any]:
    """The callables the harness relies on, by dotted name (resolved fresh on every call)."""
    funcs: dict[str, Any] = {
        "time.perf_counter": time.perf_counter, "time.perf_counter_ns": time.perf_counter_ns,
        "time.time": time.time, "time.monotonic": time.monotonic,
        "torch.allclose": torch.allclose, "torch.equal": torch.equal, "torch.isclose": torch.isclose,
        "torch.Tensor.__eq__": torch.Tensor.__eq__, "torch.Tensor.clone": torch.Tensor.clone,
        "torch.Tensor.copy_": torch.Tensor.copy_,
        "torch.cuda.synchronize": torch.cuda.synchronize, "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.current_stream": torch.cuda.current_stream, "torch.cuda.Stream": torch.cuda.Stream,
        "torch.nn.Module.__call__": torch.nn.Module.__call__,
    }
    event = torch.cuda.Event
    for name in ("record", "synchronize", "elapsed_time", "query", "wait"):
        funcs[f"torch.cuda.Event.{name}"] = getattr(event, name, None)
    stream = torch.cuda.Stream
    for name in ("synchronize", "wait_stream", "query"):
        funcs[f"torch.cuda.Stream.{name}"] = getattr(stream, name, None)
    return funcs


def native_thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _global_state() -> dict[str, Any]:
    b = torch.backends
    return {
        "cuda.matmul.allow_tf32": b.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": b.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": b.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cudnn.allow_tf32": b.cudnn.allow_tf32,
        "cudnn.benchmark": b.cudnn.benchmark,
        "cudnn.deterministic": b.cudnn.deterministic,
        "cudnn.enabled": b.cudnn.enabled,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "num_threads": torch.get_num_threads(),
        "grad_enabled": torch.is_grad_enabled(),
    }


@dataclass(frozen=True)
class GuardSnapshot:
    state: dict[str, Any]
    functions: dict[str, Any]
    python_threads: int
    native_threads: int


def take_snapshot() -> GuardSnapshot:
    return GuardSnapshot(_global_state(), _timing_functions(), threading.active_count(), native_thread_count())


def compare(before: GuardSnapshot, phase: str) -> list[Flag]:
    """Flags for every difference between `before` and now, each naming what changed during `phase`."""
    flags: list[Flag] = []
    now = _global_state()
    for key, value in before.state.items():
        if key == "grad_enabled":
            continue
        if now[key] != value:
            flags.append(Flag("guard.global_state", Severity.ERROR,
                              f"{key} changed from {value} to {now[key]} during {phase}", source="runtime"))
    funcs = _timing_functions()
    for name, func in before.functions.items():
        if funcs.get(name) is not func:
            flags.append(Flag("guard.timer_patching", Severity.ERROR,
                              f"{name} was replaced during {phase}", source="runtime"))
    py_threads, native = threading.active_count(), native_thread_count()
    if py_threads > before.python_threads:
        flags.append(Flag("guard.threads", Severity.ERROR,
                          f"Python threads grew from {before.python_threads} to {py_threads} during {phase}",
                          source="runtime"))
    elif native > before.native_threads:
        # Rationale: CUDA, cuBLAS and OpenMP start native helper threads lazily, so growth alone is only
        # a warning; std::thread in a candidate's source is rejected by the static rules.
        flags.append(Flag("guard.native_threads", Severity.WARNING,
                          f"native threads grew from {before.native_threads} to {native} during {phase}",
                          source="runtime"))
    return flags


def restore(before: GuardSnapshot) -> None:
    """Put the global numeric state back as it was in `before` (functions are not re-patched)."""
    s, b = before.state, torch.backends
    b.cuda.matmul.allow_tf32 = s["cuda.matmul.allow_tf32"]
    b.cuda.matmul.allow_fp16_reduced_precision_reduction = s["cuda.matmul.allow_fp16_reduced_precision_reduction"]
    b.cuda.matmul.allow_bf16_reduced_precision_reduction = s["cuda.matmul.allow_bf16_reduced_precision_reduction"]
    b.cudnn.allow_tf32 = s["cudnn.allow_tf32"]
    b.cudnn.benchmark = s["cudnn.benchmark"]
    b.cudnn.deterministic = s["cudnn.deterministic"]
    b.cudnn.enabled = s["cudnn.enabled"]
    torch.set_float32_matmul_precision(s["float32_matmul_precision"])
    torch.set_default_dtype(getattr(torch, s["default_dtype"].removeprefix("torch.")))
    torch.use_deterministic_algorithms(s["deterministic_algorithms"])
    torch.set_num_threads(s["num_threads"])
