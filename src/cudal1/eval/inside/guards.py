"""Runtime guards in the candidate's runner: what the candidate changed in its own process, as flags.

The candidate runs alone in its process (the reference, the comparison and the verdict are elsewhere), so
nothing it changes here can alter the reference or the verdict: these guards are a cheap first filter that
names what a candidate did, and the profile decides whether that rejects. A candidate can defeat them all
(it can rewrite this module); the guarantees live in the parent (see `session.py`).

Covered: global numeric state (TF32 switches, cuDNN benchmark/deterministic/enabled, float32 matmul
precision, scaled-dot-product attention backends, default dtype and device, mkldnn, deterministic
algorithms, intra-op thread count), the number of live threads (Python ones, `_thread` ones included, and
native ones from /proc), the identity of timing and harness functions, process-wide nn.Module hooks, torch
function and dispatch modes left active, profile/trace/monitoring hooks, signal handlers and interval
timers; a guarded function's code object swapped under the same function, and the harness's methods
shadowed on its instances (`shadowed_methods`). Not covered: state inside C++ extensions, environment
variables read later by libraries.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from cudal1.core import flags as F
from cudal1.core.types import Flag

# Rationale: a candidate that replaces any of these (a timer, an event, the harness's own helpers) forges
# what its runner reports; the parent's clock catches the effect, this names the cause. New attributes are
# ignored (torch adds some lazily).
GUARDED_NAMESPACES = ("time", "torch", "torch.Tensor", "torch.nn.Module", "torch.nn.functional", "torch.cuda",
                      "torch.cuda.Event", "torch.cuda.Stream", "torch.testing", "cudal1.eval.inside.harness",
                      "cudal1.eval.inside.harness.ModelSide", "cudal1.eval.shared.arena",
                      "cudal1.eval.shared.arena.TensorArena", "cudal1.eval.shared.arena.Arena",
                      "cudal1.eval.shared.doorbell", "cudal1.eval.shared.doorbell.Doorbell",
                      "cudal1.eval.shared.channel.Channel")


def _namespace(name: str) -> Any:
    import importlib

    head, _, attr = name.rpartition(".")
    if head and not attr[:1].islower():  # a class inside a module, e.g. torch.cuda.Event
        return getattr(importlib.import_module(head), attr)
    return importlib.import_module(name)


def _timing_functions() -> dict[str, Any]:
    """Every callable attribute of the guarded namespaces, by dotted name, and the modules the harness's own
    modules reach their clocks through (a candidate that swaps `harness.time` for an object of its own
    replaces every clock the harness reads from it)."""
    funcs: dict[str, Any] = {}
    for ns_name in GUARDED_NAMESPACES:
        ns = _namespace(ns_name)
        for attr, value in list(vars(ns).items()):
            if callable(value) or isinstance(value, (staticmethod, classmethod, property)) or (
                    ns_name.startswith("cudal1.") and isinstance(value, types.ModuleType)):
                funcs[f"{ns_name}.{attr}"] = value
    return funcs


NEW_THREAD_GRACE_S = 0.02


def python_thread_count() -> int:
    """Threads running Python code, including those started with `_thread` (which `threading` misses)."""
    return len(sys._current_frames())


def _thread_names() -> str:
    """The names of the `threading` threads besides the main one, for the report (names prove nothing)."""
    names = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    return f" (threads: {', '.join(names)[:120]})" if names else ""


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


#: Global switches that only choose algorithms and keep float32 arithmetic: a change is reported
#: (`guard.algorithm_flags`), not rejected; every other switch can change precision (`guard.global_state`).
ALGORITHM_SWITCHES = frozenset({"cudnn.benchmark", "cudnn.deterministic", "cudnn.enabled", "deterministic_algorithms",
                                "num_threads", "mkldnn.enabled", *(f"cuda.{n}" for n in SDP_SWITCHES)})


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


def _hook_counts() -> dict[str, int]:
    """Process-wide nn.Module hooks by kind (they run around every module's forward, the reference's too
    when it shares the process)."""
    from torch.nn.modules import module as m

    names = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
             "_global_backward_pre_hooks", "_global_module_registration_hooks",
             "_global_parameter_registration_hooks", "_global_buffer_registration_hooks")
    return {n.strip("_"): len(getattr(m, n)) for n in names if hasattr(m, n)}


def _mode_depths() -> dict[str, int]:
    out = {}
    for name in ("_len_torch_function_stack", "_len_torch_dispatch_stack"):
        fn = getattr(torch._C, name, None)
        if fn is not None:
            out[name.removeprefix("_len_")] = int(fn())
    return out


def _trace_hooks() -> list[str]:
    hooks = []
    if sys.gettrace() is not None:
        hooks.append("sys.settrace")
    if sys.getprofile() is not None:
        hooks.append("sys.setprofile")
    for name in ("gettrace", "getprofile"):
        getter = getattr(threading, name, None)
        if getter is not None and getter() is not None:
            hooks.append(f"threading.{name.replace('get', 'set')}")
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        hooks += [f"sys.monitoring tool {i}" for i in range(6) if monitoring.get_tool(i) is not None]
    return hooks


def _signal_state() -> dict[str, str]:
    state = {}
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        state[f"signal {int(sig)}"] = repr(handler)
    for name in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF"):
        which = getattr(signal, name, None)
        if which is not None:
            state[name] = "armed" if signal.getitimer(which) != (0.0, 0.0) else "off"
    return state


@dataclass(frozen=True)
class GuardSnapshot:
    state: dict[str, Any]
    functions: dict[str, Any]
    python_threads: int
    native_threads: int
    class_attrs: frozenset[str] = frozenset()  # every attribute name of the guarded classes
    hooks: dict[str, int] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    trace: tuple[str, ...] = ()
    signals: dict[str, str] = field(default_factory=dict)
    codes: dict[str, Any] = field(default_factory=dict)  # the code object of each guarded Python function


def code_of(value: Any) -> Any:
    """The code object behind a guarded callable (a function, a method, a static or class method, a
    property's getter); None for builtins."""
    if isinstance(value, property):
        value = value.fget
    value = getattr(value, "__func__", value)
    return getattr(value, "__code__", None)


def take_snapshot() -> GuardSnapshot:
    attrs = frozenset(f"{n}.{a}" for n, cls in _class_namespaces().items() for a in vars(cls))
    functions = _timing_functions()
    codes = {n: c for n, f in functions.items() if (c := code_of(f)) is not None}
    return GuardSnapshot(_global_state(), functions, python_thread_count(), native_thread_count(),
                         attrs, _hook_counts(), _mode_depths(), tuple(_trace_hooks()), _signal_state(), codes)


def process_hook_flags(before: GuardSnapshot, phase: str) -> list[Flag]:
    """Flags for process-wide hooks, modes, trace hooks and signal handlers added since `before`."""
    out: list[Flag] = []
    grew = [f"{k} ({before.hooks.get(k, 0)} -> {v})" for k, v in _hook_counts().items() if v > before.hooks.get(k, 0)]
    if grew:
        out.append(F.runtime_flag(F.GLOBAL_HOOKS, f"process-wide module hooks registered during {phase}: "
                        + ", ".join(grew), source="runtime"))
    deeper = [f"{k} {before.modes.get(k, 0)} -> {v}" for k, v in _mode_depths().items() if v > before.modes.get(k, 0)]
    if deeper:
        out.append(F.runtime_flag(F.FUNCTION_MODE, f"torch modes left active after {phase}: " + ", ".join(deeper),
                        source="runtime"))
    new_trace = [h for h in _trace_hooks() if h not in before.trace]
    if new_trace:
        out.append(F.runtime_flag(F.TRACE_HOOK, f"{', '.join(new_trace)} installed during {phase}",
                        source="runtime"))
    now = _signal_state()
    changed = [k for k, v in now.items() if before.signals.get(k, v) != v]
    if changed:
        out.append(F.runtime_flag(F.SIGNAL_HANDLERS, f"{', '.join(changed[:4])} changed during {phase}",
                        source="runtime"))
    return out


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
    # The same function object with another body: its `__code__` swapped (the identity check alone passes)
    replaced += [f"{n} (its code)" for n, code in before.codes.items() if n in funcs and funcs[n] is before.functions[n]
                 and code_of(funcs[n]) is not code and not is_torch_internal(funcs[n])]
    return replaced + added_class_attributes(before)


def shadowed_methods(objects: dict[str, Any], classes: dict[str, type]) -> list[str]:
    """The harness's own objects (`objects` by name) changed below their classes, which the class-level checks
    do not see: a callable set on an instance over a callable of its class (a method shadowed there), or an
    instance whose class is no longer the one it had (`classes`, taken before the candidate's import: a
    subclass swapped in through `__class__` overrides every method at once)."""
    out = []
    for name, obj in objects.items():
        if name in classes and type(obj) is not classes[name]:
            out.append(f"{name} (its class, now {type(obj).__qualname__})")
        for attr, value in list(getattr(obj, "__dict__", {}).items()):
            if callable(value) and callable(getattr(type(obj), attr, None)):
                out.append(f"{name}.{attr}")
    return out


def shadowing_flag(objects: dict[str, Any], classes: dict[str, type], phase: str, seen: set[str]) -> Flag | None:
    """`guard.timer_patching` for the harness's instances changed since the last look (`shadowed_methods`;
    `seen` holds those already reported, and is updated)."""
    new = [n for n in shadowed_methods(objects, classes) if n not in seen]
    if not new:
        return None
    seen.update(new)
    more = f" (+{len(new) - 1} more)" if len(new) > 1 else ""
    return F.runtime_flag(F.TIMER_PATCHING, f"{new[0]} was shadowed on the harness's instance during {phase}{more}",
                source="runtime")


def compare(before: GuardSnapshot, phase: str) -> list[Flag]:
    """Flags for every difference between `before` and now, each naming what changed during `phase`."""
    flags: list[Flag] = []
    now = _global_state()
    for key, value in before.state.items():
        if key == "grad_enabled":
            continue
        if now[key] != value:
            rule = F.ALGORITHM_FLAGS if key in ALGORITHM_SWITCHES else F.GLOBAL_STATE
            flags.append(F.runtime_flag(rule, f"{key} changed from {value} to {now[key]} during {phase}"))
    replaced = replaced_functions(before)
    if replaced:
        more = f" (+{len(replaced) - 1} more)" if len(replaced) > 1 else ""
        flags.append(F.runtime_flag(F.TIMER_PATCHING, f"{replaced[0]} was replaced during {phase}{more}", source="runtime"))
    py_threads, native = python_thread_count(), native_thread_count()
    if native > before.native_threads and py_threads <= before.python_threads:
        # A thread started just now may not run Python yet; library helper threads never will.
        time.sleep(NEW_THREAD_GRACE_S)
        py_threads = python_thread_count()
    if py_threads > before.python_threads:
        flags.append(F.runtime_flag(F.THREADS, f"Python threads grew from {before.python_threads} to {py_threads} during {phase}"
                          f"{_thread_names()}", source="runtime"))
    elif native > before.native_threads:
        # Rationale: CUDA, cuBLAS and OpenMP start native helper threads lazily, so growth alone is only
        # a warning; std::thread in a candidate's source is rejected by the static rules.
        flags.append(F.runtime_flag(F.NATIVE_THREADS, f"native threads grew from {before.native_threads} to {native} during {phase}",
                          source="runtime"))
    return flags + process_hook_flags(before, phase)


def _class_namespaces() -> dict[str, type]:
    return {n: ns for n in GUARDED_NAMESPACES if isinstance(ns := _namespace(n), type)}


def added_class_attributes(before: GuardSnapshot) -> list[str]:
    """Callables set on a guarded class since `before` (e.g. `torch.Tensor.__gt__` shadowing the base's),
    other than PyTorch's own."""
    known = set(before.functions) | set(before.class_attrs)
    return [f"{n}.{a}" for n, cls in _class_namespaces().items() for a, v in list(vars(cls).items())
            if f"{n}.{a}" not in known and callable(v) and not is_torch_internal(v)]
