"""Runtime guards: what a candidate must not change in the worker process, checked around its code.

Covered: global numeric state (TF32 switches, cuDNN benchmark/deterministic/enabled, float32 matmul
precision, scaled-dot-product attention backends, default dtype and device, mkldnn, deterministic
algorithms, intra-op thread count; flush-denormal has no getter and is not covered), the number of
live threads (every thread running Python code, `_thread` ones included, and native ones from /proc), and the identity of the functions the harness times and
compares with (CUDA events, synchronize, streams, perf_counter, allclose...). `restore` puts the global
state back, so a candidate's flag change can never speed up or slow down the reference.
Not covered: state inside C++ extensions, environment variables read later by libraries, and anything
that re-patches the functions *after* the check and before the harness calls them (the worker checks
again after every phase).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from cudal1.core.types import Flag, Severity

# Rationale: a candidate that replaces any of these (a Tensor comparison operator, a functional op the
# reference uses, a timer, the harness's own helpers) can fake correctness or speed. Identities of every
# callable in them are snapshotted and restored; new attributes are ignored (torch adds some lazily).
GUARDED_NAMESPACES = ("time", "torch", "torch.Tensor", "torch.nn.Module", "torch.nn.functional", "torch.cuda",
                      "torch.cuda.Event", "torch.cuda.Stream", "torch.testing", "cudal1.eval.correctness",
                      "cudal1.eval.timing", "cudal1.eval.guards", "cudal1.eval.worker", "cudal1.eval.worker.Evaluation")


def _namespace(name: str) -> Any:
    import importlib

    head, _, attr = name.rpartition(".")
    if head and not attr[:1].islower():  # a class inside a module, e.g. torch.cuda.Event
        return getattr(importlib.import_module(head), attr)
    return importlib.import_module(name)


def _timing_functions() -> dict[str, Any]:
    """Every callable attribute of the guarded namespaces, by dotted name."""
    funcs: dict[str, Any] = {}
    for ns_name in GUARDED_NAMESPACES:
        ns = _namespace(ns_name)
        for attr, value in list(vars(ns).items()):
            if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                funcs[f"{ns_name}.{attr}"] = value
    return funcs


NEW_THREAD_GRACE_S = 0.02


def python_thread_count() -> int:
    """Threads running Python code, including those started with `_thread` (which `threading` misses)."""
    return len(sys._current_frames())


def native_thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


SDP_SWITCHES = ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled")

#: (backend, op) switches of PyTorch's `fp32_precision` API (2.9+), e.g. `torch.backends.cudnn.conv`'s.
# Rationale: setting one of these directly can turn TF32 on without changing what the legacy `allow_tf32`
# flags read; after a mix of the two APIs the legacy getters even raise. So the raw switches are guarded too.
FP32_PRECISION_SWITCHES = (("generic", "all"), ("cuda", "all"), ("cuda", "conv"), ("cuda", "rnn"),
                           ("cuda", "matmul"), ("mkldnn", "all"), ("mkldnn", "conv"), ("mkldnn", "rnn"),
                           ("mkldnn", "matmul"))

#: What a legacy getter reads when PyTorch refuses to answer (its switches were set inconsistently).
INCONSISTENT = "inconsistent"


def _read(getter: Any) -> Any:
    try:
        return getter()
    except RuntimeError:  # "mix of the legacy and new APIs", "different TF32 flags": a change all the same
        return INCONSISTENT


def _fp32_precisions() -> dict[str, str]:
    getter = getattr(torch._C, "_get_fp32_precision_getter", None)
    if getter is None:
        return {}
    out = {}
    for backend, op in FP32_PRECISION_SWITCHES:
        try:
            out[f"fp32_precision.{backend}.{op}"] = getter(backend, op)
        except RuntimeError:
            continue  # a switch this PyTorch does not have
    return out


def _global_state() -> dict[str, Any]:
    b = torch.backends
    return {
        "cuda.matmul.allow_tf32": _read(lambda: b.cuda.matmul.allow_tf32),
        "cuda.matmul.allow_fp16_reduced_precision_reduction": b.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": b.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cudnn.allow_tf32": _read(lambda: b.cudnn.allow_tf32),
        "cudnn.benchmark": b.cudnn.benchmark,
        "cudnn.deterministic": b.cudnn.deterministic,
        "cudnn.enabled": b.cudnn.enabled,
        "float32_matmul_precision": _read(torch.get_float32_matmul_precision),
        **_fp32_precisions(),
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "num_threads": torch.get_num_threads(),
        "mkldnn.enabled": b.mkldnn.enabled,
        "default_device": str(torch.get_default_device()) if hasattr(torch, "get_default_device") else "",
        **{f"cuda.{n}": getattr(b.cuda, n)() for n in SDP_SWITCHES if hasattr(b.cuda, n)},
        "grad_enabled": torch.is_grad_enabled(),
    }


def use_exact_fp32() -> None:
    """True fp32 for this process: TF32 off for cuDNN (PyTorch's default is on) and for matmuls."""
    b = torch.backends
    b.cudnn.allow_tf32 = False
    b.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


@dataclass(frozen=True)
class GuardSnapshot:
    state: dict[str, Any]
    functions: dict[str, Any]
    python_threads: int
    native_threads: int
    class_attrs: frozenset[str] = frozenset()  # every attribute name of the guarded classes


def take_snapshot() -> GuardSnapshot:
    attrs = frozenset(f"{n}.{a}" for n, cls in _class_namespaces().items() for a in vars(cls))
    return GuardSnapshot(_global_state(), _timing_functions(), python_thread_count(), native_thread_count(),
                         attrs)


def _torch_dir() -> str:
    return os.path.dirname(torch.__file__) + os.sep


def is_torch_internal(obj: Any) -> bool:
    """Whether a callable is PyTorch's own code (its Python source lives in the torch package, or it is a
    torch C builtin). PyTorch patches itself lazily — torch.compile's mutation guard rebinds
    `nn.Module.__init__` — and that must not be mistaken for a candidate's patch."""
    func = getattr(obj, "__func__", obj)
    code = getattr(func, "__code__", None)
    if code is not None:
        return code.co_filename.startswith(_torch_dir())
    return type(func).__name__ == "builtin_function_or_method" and str(getattr(func, "__module__", "")).startswith(
        "torch")


def replaced_functions(before: GuardSnapshot) -> list[str]:
    """Guarded callables replaced (by something other than PyTorch itself) or deleted since `before`,
    and callables added to guarded classes."""
    funcs = _timing_functions()
    replaced = [n for n, f in before.functions.items() if n in funcs and funcs[n] is not f
                and not is_torch_internal(funcs[n])]
    replaced += [n for n in before.functions if n not in funcs]  # deleted
    return replaced + added_class_attributes(before)


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
    replaced = replaced_functions(before)
    if replaced:
        more = f" (+{len(replaced) - 1} more)" if len(replaced) > 1 else ""
        flags.append(Flag("guard.timer_patching", Severity.ERROR,
                          f"{replaced[0]} was replaced during {phase}{more}", source="runtime"))
    py_threads, native = python_thread_count(), native_thread_count()
    if native > before.native_threads and py_threads <= before.python_threads:
        # A thread started just now may not run Python yet; library helper threads never will.
        time.sleep(NEW_THREAD_GRACE_S)
        py_threads = python_thread_count()
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


def _class_namespaces() -> dict[str, type]:
    return {n: ns for n in GUARDED_NAMESPACES if isinstance(ns := _namespace(n), type)}


def added_class_attributes(before: GuardSnapshot) -> list[str]:
    """Callables set on a guarded class since `before` (e.g. `torch.Tensor.__gt__` shadowing the base's),
    other than PyTorch's own."""
    known = set(before.functions) | set(before.class_attrs)
    return [f"{n}.{a}" for n, cls in _class_namespaces().items() for a, v in list(vars(cls).items())
            if f"{n}.{a}" not in known and callable(v) and not is_torch_internal(v)]


def restore_functions(before: GuardSnapshot) -> None:
    """Put back every guarded callable a candidate replaced or deleted; remove what it added to classes."""
    now = _timing_functions()
    for name, func in before.functions.items():
        if now.get(name) is not func and not (name in now and is_torch_internal(now[name])):
            ns_name, _, attr = name.rpartition(".")
            ns = _namespace(ns_name)
            if isinstance(ns, type):
                type.__setattr__(ns, attr, func)
            else:
                setattr(ns, attr, func)
    for name in added_class_attributes(before):
        ns_name, _, attr = name.rpartition(".")
        type.__delattr__(_namespace(ns_name), attr)


def restore(before: GuardSnapshot) -> None:
    """Put the global numeric state and every guarded callable back as they were in `before`.

    Only settings that differ are set again: some setters have side effects (enabling deterministic
    algorithms rebinds `torch.manual_seed`), and the callables are restored last.
    """
    s, b, now = before.state, torch.backends, _global_state()
    setters = {
        "cuda.matmul.allow_tf32": lambda v: setattr(b.cuda.matmul, "allow_tf32", v),
        "cuda.matmul.allow_fp16_reduced_precision_reduction":
            lambda v: setattr(b.cuda.matmul, "allow_fp16_reduced_precision_reduction", v),
        "cuda.matmul.allow_bf16_reduced_precision_reduction":
            lambda v: setattr(b.cuda.matmul, "allow_bf16_reduced_precision_reduction", v),
        "cudnn.allow_tf32": lambda v: setattr(b.cudnn, "allow_tf32", v),
        "cudnn.benchmark": lambda v: setattr(b.cudnn, "benchmark", v),
        "cudnn.deterministic": lambda v: setattr(b.cudnn, "deterministic", v),
        "cudnn.enabled": lambda v: setattr(b.cudnn, "enabled", v),
        "float32_matmul_precision": torch.set_float32_matmul_precision,
        "default_dtype": lambda v: torch.set_default_dtype(getattr(torch, v.removeprefix("torch."))),
        "deterministic_algorithms": torch.use_deterministic_algorithms,
        "num_threads": torch.set_num_threads,
        "mkldnn.enabled": lambda v: setattr(b.mkldnn, "enabled", v),
        "default_device": lambda v: torch.set_default_device(None if v == "cpu" else v),
    }
    for name in SDP_SWITCHES:
        setters[f"cuda.{name}"] = getattr(b.cuda, "enable_" + name.removesuffix("_enabled"))
    for key, value in s.items():
        if key in setters and now.get(key) != value and value != INCONSISTENT:
            try:
                setters[key](value)
            except RuntimeError:  # a legacy setter refusing a mixed state: the raw switches below fix it
                continue
    # The raw fp32_precision switches last: the legacy setters above rewrite them.
    setter = getattr(torch._C, "_set_fp32_precision_setter", None)
    for key, value in s.items():
        if key.startswith("fp32_precision.") and setter is not None:
            _, backend, op = key.split(".")
            if torch._C._get_fp32_precision_getter(backend, op) != value:
                setter(backend, op, value)
    restore_functions(before)
