"""Build hooks installed in every process that imports a candidate: build children and candidate runners.

`install_build_hooks()` wraps `torch.utils.cpp_extension.load_inline` and `load`: every call is timed and
recorded (name, seconds, ok, trimmed log), and the adopted build levers (`BuildLevers`) are applied to its
arguments (quiet build; lighter headers in CUDA sources, with automatic fallback to the source as written
when the lighter variant does not build; calls certain to fail fail at once). A build that fails with a
compiler error is remembered in `TORCH_EXTENSIONS_DIR/.cudal1_failed_builds.json` (lever
`remember_failures`): the same call in a later process (the candidate's runner) fails at once instead of
compiling again. torch itself replays it (only its ninja run is replaced by the remembered output), so its
extension versions, build directory, exception and message are those of the real failure. Only failures
with a compiler diagnostic are remembered, never a crash or a lack of memory, disk or time.

The candidate's runner that later imports a built candidate must run in the same environment and call
`install_build_hooks()` (levers from `$CUDAL1_BUILD_LEVERS`) before importing it: the hooks replay the
decision recorded at build time (light or original headers, file `TORCH_EXTENSIONS_DIR/.cudal1_levers.json`),
so the arguments, the ninja file and the build directory are identical and torch finds nothing to rebuild.
`BUILD_LISTENERS` hear of every real build that starts (the candidate's runner tells its parent).

In a candidate's runner without a GPU (`install_build_hooks(cuda_usable=False)`: torch sees no CUDA device, be it
a CPU build of torch or a CUDA build on a machine without a GPU), a call that compiles CUDA code raises
`NoGpuError` at once, recorded as variant `no_gpu`: decided from what the process has, not from the error torch
would raise (a CPU build says "CUDA_HOME not set", a CUDA build an IndexError from its arch detection). The
calls certain to fail (above) still fail first: they are the candidate's own errors on any machine.

Limits: a candidate that compiles through other means (setuptools, raw nvcc, ctypes) is not recorded. A
`load` call whose other arguments hold per-process paths is never replayed as remembered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from cudal1.eval.shared.compile_log import trim_compiler_log

logger = logging.getLogger(__name__)

LEVERS_ENV = "CUDAL1_BUILD_LEVERS"  # JSON of BuildLevers, read by install_build_hooks() in the runners
#: A failure caused by the machine or the tools rather than the source (memory, disk, time, a crash): never
#: remembered as the candidate's compile error (here and in the compile service).
RESOURCE_FAILURE = re.compile(r"out of memory|MemoryError|Killed|Kill signal|signal \d+|Terminated|No space left|"
                              r"Resource temporarily unavailable|Cannot allocate memory|CUDA error|timed out|"
                              r"Segmentation fault|internal compiler error", re.IGNORECASE)



@dataclass(frozen=True)
class BuildLevers:
    """The build-time levers applied by the build hooks to every `load_inline`/`load` call.

    Only levers that measurably shorten a cache-miss build and keep the candidate's semantics are on by
    default (measurements: docs/log.md, 2026-11-30).
    """

    light_cuda_headers: bool = field(default=True, metadata={
        "help": "Drop `#include <torch/extension.h>` from cuda_sources (load_inline already includes "
                "<torch/types.h>); falls back to the original source automatically if that fails to build."})
    quiet: bool = field(default=True, metadata={
        "help": "Force verbose=False so the build output is captured in the exception, not printed."})
    fail_fast_unbound: bool = field(default=True, metadata={
        "help": "A load_inline call whose `functions=` cannot be bound (cpp_sources empty, so the generated "
                "binding file never declares them) raises torch's build error at once instead of after a "
                "full build that is certain to fail."})
    fail_fast_duplicate_module: bool = field(default=True, metadata={
        "help": "A load_inline call with `functions=` whose sources define the extension's PYBIND11_MODULE "
                "too (a redefinition in main.cpp, or a duplicate symbol at link time) raises torch's build "
                "error at once instead of after a full build that is certain to fail."})
    remember_failures: bool = field(default=True, metadata={
        "help": "A call that fails with torch's build error (not for lack of memory, disk or time) is remembered "
                "in TORCH_EXTENSIONS_DIR/.cudal1_failed_builds.json; the same call (same sources and "
                "arguments) then raises the same error at once instead of compiling again (a lazy build that "
                "fails is otherwise recompiled at every evaluation)."})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def none(cls) -> BuildLevers:
        """Every lever off: torch exactly as the candidate calls it (verbose untouched)."""
        return cls(**{f.name: False for f in dataclasses.fields(cls)})

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> BuildLevers:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in names})



DECISIONS_FILE = ".cudal1_levers.json"
FAILURES_FILE = ".cudal1_failed_builds.json"
BUILD_ERROR = "Error building extension"  # head of torch's exception for a failed build
# A remembered failure must be the compiler's verdict on the source: a diagnostic, not a crash of the tools.
#: Called with the extension's name when a real build (not a remembered failure) starts: the candidate's
#: runner tells its parent, which then waits for the build's time limit rather than the import's.
BUILD_LISTENERS: list[Any] = []
_DIAGNOSTIC = re.compile(r"error\b|undefined reference|undefined symbol|multiple definition", re.IGNORECASE)
_MAX_REMEMBERED_CHARS = 100_000
# Arguments that change where or how loudly a build runs, not whether it compiles.
_CALL_KEY_IGNORED = frozenset({"verbose", "build_directory", "keep_intermediates"})
# Rationale: <torch/extension.h> = <torch/all.h> (nn, optim, data, jit, serialize ...) + pybind11 + Python.h;
# load_inline already puts <torch/types.h> (ATen + autograd variable) in front of every CUDA source, which
# is all a kernel file that only uses tensors, accessors and AT_DISPATCH needs.
_EXTENSION_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]torch/extension\.h[>\"][ \t]*$", re.MULTILINE)
# Rationale: a CUDA source using these needs more than <torch/types.h>; do not try the light variant
# (a failing attempt costs the front-end pass, ~6 CPU s, before the fallback). `.type()` (the deprecated
# `AT_DISPATCH_*(x.type(), ...)` idiom) fails with the light headers of torch 2.13: measured on CUDA-L1
# level 1 task 42, "no suitable conversion function from at::DeprecatedTypeProperties" (docs/log.md).
_NEEDS_FULL_HEADERS = re.compile(r"PYBIND11|pybind11|\bpy::|torch::nn\b|torch::optim\b|torch::jit\b|"
                                 r"torch::data\b|torch::serialize\b|torch/python\.h|TORCH_LIBRARY|"
                                 r"\.type\(\s*\)")


def unbound_functions(cpp_sources: Any, functions: Any, extra_cflags: Any = None) -> list[str]:
    """The `functions=` of a load_inline call that its binding file (main.cpp) cannot declare.

    load_inline writes main.cpp as `#include <torch/extension.h>`, then `cpp_sources`, then a
    `PYBIND11_MODULE` whose `m.def(name, ...)` needs every name declared there. With empty `cpp_sources`
    nothing declares them (the CUDA file is a separate translation unit), so the build is certain to fail.
    Only argument types torch accepts count (str or list of str; functions as str, list or dict: torch
    raises its own AttributeError/ValueError for others), and a forced `-include` in `extra_cflags` could
    declare them; anything less certain returns [] and is left to torch and the compiler.
    """
    if not isinstance(functions, str | list | dict) or not functions:
        return []
    texts = [cpp_sources] if isinstance(cpp_sources, str) else cpp_sources
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts) or any(t.strip() for t in texts):
        return []
    flags = extra_cflags if isinstance(extra_cflags, list | tuple) else []
    if any(isinstance(f, str) and f.lstrip("-").startswith(("include", "imacros")) for f in flags):
        return []
    names = [functions] if isinstance(functions, str) else list(functions)
    return [n for n in names if isinstance(n, str)]


def unbound_functions_log(name: str, missing: list[str]) -> str:
    """The compiler's verdict on main.cpp for `missing`, with the fix (it becomes LLM feedback)."""
    return "\n".join(
        f"main.cpp: error: '{f}' was not declared in this scope (load_inline '{name}' binds functions= in "
        "main.cpp, which holds only cpp_sources, and cpp_sources is empty: declare it there, e.g. "
        f"cpp_sources='torch::Tensor {f}(torch::Tensor x);')"
        for f in missing)


_CONDITIONAL = re.compile(r"^\s*#\s*if", re.M)


def duplicate_module_log(name: str, cpp_sources: Any, cuda_sources: Any, functions: Any, *,
                         name_in_use: bool = False) -> str:
    """The compiler's or linker's verdict when a load_inline call defines its Python module twice, else "".

    With `functions=`, load_inline appends its own `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)` to main.cpp; a
    second one for the same module in `cpp_sources` is a redefinition of `PyInit_<name>` in that file, one
    in `cuda_sources` a duplicate symbol at link time: certain failures, after a full compile.
    TORCH_EXTENSION_NAME is `name`, unless this process already loaded an extension of that name
    (`name_in_use`): torch then builds `<name>_v1`, so only a module spelled TORCH_EXTENSION_NAME is
    certain to clash. Only plain-string sources and the argument types torch accepts count; comments and
    strings are ignored, and a source with preprocessor conditionals is left to the compiler (the module
    may be switched off), as is anything else less certain.
    """
    if not isinstance(functions, str | list | dict) or not functions or not isinstance(name, str):
        return ""
    from cudal1.analysis.cuda_source import strip_comments_and_strings

    spellings = "TORCH_EXTENSION_NAME" if name_in_use else f"TORCH_EXTENSION_NAME|{re.escape(name)}"
    module = re.compile(r"PYBIND11_MODULE\s*\(\s*(?:" + spellings + r")\s*,")

    def defines(sources: Any) -> bool:
        texts = [sources] if isinstance(sources, str) else sources
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return False
        code = [strip_comments_and_strings(t) for t in texts]
        return not any(_CONDITIONAL.search(c) for c in code) and any(module.search(c) for c in code)

    fix = (f"(load_inline '{name}' writes its own PYBIND11_MODULE to bind functions=; define the module "
           "once: drop functions= or the PYBIND11_MODULE in the sources)")
    if defines(cpp_sources):
        return f"main.cpp: error: redefinition of 'PyObject* PyInit_{name}()' {fix}"
    if defines(cuda_sources):
        return f"ld: error: multiple definition of 'PyInit_{name}' (main.o and cuda.cuda.o) {fix}"
    return ""


@dataclass
class BuildRecord:
    """One recorded `load_inline`/`load` call."""

    name: str
    seconds: float
    ok: bool
    log: str = ""
    variant: str = "original"  # "light": lighter headers built; "fallback": light failed, original built;
    # "unbound": failed at once, `functions=` cannot be bound (see `unbound_functions`);
    # "duplicate_module": failed at once, the module is defined twice (see `duplicate_module_log`);
    # "remembered": failed at once, the same call failed to build before (`BuildLevers.remember_failures`)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": round(self.seconds, 3), "ok": self.ok, "variant": self.variant}


def _read_json(path: Path | None) -> dict[str, Any]:
    """The JSON object in `path`; {} when there is none (no file, unreadable, not an object)."""
    try:
        data = json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _set_json_entry(path: Path | None, key: str, value: Any) -> None:
    """Set one entry of the JSON object in `path`, atomically (a temporary file, then a rename): a process
    reading it meanwhile sees the old or the new content, never half of it."""
    if path is None:
        return
    data = _read_json(path)
    data[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # a name per writer
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


@dataclass
class BuildRecorder:
    """State of the installed hooks: the records, the levers, the decisions and failures files."""

    levers: BuildLevers
    records: list[BuildRecord] = field(default_factory=list)

    @staticmethod
    def _path(filename: str) -> Path | None:
        root = os.environ.get("TORCH_EXTENSIONS_DIR")
        return Path(root) / filename if root else None

    def load_decisions(self) -> dict[str, str]:
        return _read_json(self._path(DECISIONS_FILE))

    def save_decision(self, key: str, variant: str) -> None:
        _set_json_entry(self._path(DECISIONS_FILE), key, variant)

    def remembered_failure(self, call_key: str) -> str | None:
        """The build output of an earlier failed build of the same call, else None."""
        output = _read_json(self._path(FAILURES_FILE)).get(call_key)
        return output if isinstance(output, str) else None

    def remember_failure(self, call_key: str, output: str) -> None:
        """Keep the build output of torch's exception (what follows its `Error building extension 'X': `
        head); a failure to write only costs the next evaluation a real build."""
        with contextlib.suppress(OSError):
            _set_json_entry(self._path(FAILURES_FILE), call_key, output[-_MAX_REMEMBERED_CHARS:])


@contextlib.contextmanager
def capture_fds() -> Iterator[list[str]]:
    """Redirect file descriptors 1 and 2 (C++ and subprocess output included) into a buffer.

    Yields a list that holds the captured text once the block ends.
    """
    sink: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield sink
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            tmp.seek(0)
            sink.append(tmp.read()[-200_000:].decode(errors="replace"))


def light_cuda_sources(cuda_sources: Any) -> list[str] | None:
    """The CUDA sources without `#include <torch/extension.h>`, or None when the lever does not apply."""
    if cuda_sources is None:
        return None
    sources = [cuda_sources] if isinstance(cuda_sources, str) else list(cuda_sources)
    if not all(isinstance(s, str) for s in sources):
        return None
    text = "\n".join(sources)
    if not _EXTENSION_INCLUDE.search(text) or _NEEDS_FULL_HEADERS.search(text):
        return None
    return [_EXTENSION_INCLUDE.sub("", s) for s in sources]


def _decision_key(name: str, cuda_sources: Any) -> str:
    text = cuda_sources if isinstance(cuda_sources, str) else "\n".join(map(str, cuda_sources or []))
    return f"{name}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _forget_version(cpp_extension: Any, name: str) -> None:
    """Reset torch's in-process version counter of `name`, so that the fallback build keeps the same module
    name and directory as a fresh process would use (otherwise torch renames it `<name>_v1`)."""
    entries = getattr(getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None), "entries", None)
    if isinstance(entries, dict):
        entries.pop(name, None)


def _call_key(name: Any, sources: Any, args: tuple, kwargs: dict[str, Any]) -> str:
    """`name:sha256` of what decides whether a build compiles: the sources and every argument except those
    that only change where or how loudly it runs (`_CALL_KEY_IGNORED`)."""
    kept = {k: v for k, v in kwargs.items() if k not in _CALL_KEY_IGNORED}
    text = json.dumps([sources, list(args), kept], sort_keys=True, default=repr)
    return f"{name}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _file_digests(sources: Any) -> Any:
    """`load`'s source paths as [file name, content hash]: a candidate writes its files into a directory of
    its own (the child's temporary working directory, a new one in each process), so a path never recurs."""
    paths = [sources] if isinstance(sources, str) else sources
    if not isinstance(paths, list | tuple):
        return repr(sources)
    digests: list[Any] = []
    for path in paths:
        try:
            digests.append([os.path.basename(path), hashlib.sha256(Path(path).read_bytes()).hexdigest()])
        except (OSError, TypeError, ValueError):  # not a readable path: torch reports it
            digests.append(repr(path))
    return digests


_replay = threading.local()  # .output: the build output to fail this thread's next ninja run with


def _install_replay(cpp_extension: Any) -> bool:
    """Wrap torch's `_run_ninja_build` (once) so that a remembered failure is replayed in place of the ninja
    run: torch does everything else as for a real build (its per-process extension versions, the build
    directory, the exception and its message), so a replayed call behaves exactly like the failed one.
    False when this torch has no such function (then failures are built again)."""
    real = getattr(cpp_extension, "_run_ninja_build", None)
    if real is None:
        return False
    if not hasattr(real, "__cudal1_real__"):
        def run_ninja_build(build_directory, verbose, error_prefix, *args, **kwargs):
            output = getattr(_replay, "output", None)
            if output is not None:
                raise RuntimeError(f"{error_prefix}: {output}")
            return real(build_directory, verbose, error_prefix, *args, **kwargs)

        run_ninja_build.__cudal1_real__ = real  # type: ignore[attr-defined]
        cpp_extension._run_ninja_build = run_ninja_build
    return True


@contextlib.contextmanager
def _replaying(output: str) -> Iterator[None]:
    _replay.output = output
    try:
        yield
    finally:
        _replay.output = None


def _build_output(error: BaseException) -> str | None:
    """The build output inside torch's failed-build exception, or None when it is not one."""
    text = str(error)
    if not text.startswith(BUILD_ERROR) or "': " not in text:
        return None
    return text.split("': ", 1)[1]


def _raise_build_error(recorder: BuildRecorder, name: Any, variant: str, log: str) -> NoReturn:
    """Fail a call at once, recorded as `variant`, with the same exception type and head as torch's failed
    build, so a candidate's except clause behaves exactly as it would after the real failure."""
    recorder.records.append(BuildRecord(name, 0.0, False, log, variant))
    raise RuntimeError(f"{BUILD_ERROR} '{name}':\n{log}")


class NoGpuError(RuntimeError):
    """A CUDA build refused in a process without a GPU: the machine's lack, not the candidate's error."""


def builds_cuda_code(cuda_sources: Any = None, sources: Any = None, with_cuda: Any = None) -> bool:
    """Whether a `load_inline` call (`cuda_sources`) or a `load` call (`sources`) compiles CUDA code: torch's
    own rule (`with_cuda`, else any CUDA source)."""
    if with_cuda is not None:
        return bool(with_cuda)
    if cuda_sources:
        return True
    paths = [sources] if isinstance(sources, str) else sources if isinstance(sources, list | tuple) else []
    return any(isinstance(p, str) and p.endswith((".cu", ".cuh")) for p in paths)


def _raise_no_gpu(recorder: BuildRecorder, name: Any) -> NoReturn:
    log = f"{name}: compiles CUDA code, and this process has no GPU (torch.cuda.is_available() is False)"
    recorder.records.append(BuildRecord(name, 0.0, False, log, "no_gpu"))
    raise NoGpuError(log)


def _timed_call(recorder: BuildRecorder, fn: Any, name: str, variant: str, args: tuple, kwargs: dict,
                remember: str | None = None) -> Any:
    """Call the real builder, record time and outcome; re-raise its exception (the candidate may catch it).
    With `remember` (a call key), a failed compile is remembered unless it looks like a lack of resources
    (memory, disk, time: it may pass on a quieter machine)."""
    if variant != "remembered":
        for listener in list(BUILD_LISTENERS):
            with contextlib.suppress(Exception):
                listener(name)
    start = time.monotonic()
    with capture_fds() as captured:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            error: BaseException | None = exc
        else:
            error = None
    seconds = time.monotonic() - start
    if error is None:
        recorder.records.append(BuildRecord(name, seconds, True, variant=variant))
        return result
    text = f"{captured[0] if captured else ''}\n{type(error).__name__}: {error}"
    log = trim_compiler_log(text)
    recorder.records.append(BuildRecord(name, seconds, False, log, variant))
    output = _build_output(error) if remember is not None else None
    if output is not None and _DIAGNOSTIC.search(output) and not RESOURCE_FAILURE.search(text):
        recorder.remember_failure(remember, output)
    raise error


def install_build_hooks(levers: BuildLevers | dict | None = None, *, cuda_usable: bool | None = None) -> BuildRecorder:
    """Wrap `torch.utils.cpp_extension.load_inline` and `load` with recording, lever-applying hooks.

    Call before importing a candidate, in the build child and in the candidate's runner alike (same
    levers, same environment). `levers=None` takes them from `$CUDAL1_BUILD_LEVERS` (set by
    `compile.build_environment`), else the defaults. `cuda_usable=False` (a candidate's runner without a GPU)
    refuses CUDA builds with `NoGpuError`; None (a build child, which may build for a GPU it does not see)
    builds them. Returns the recorder (one `BuildRecord` per call).
    """
    import torch.utils.cpp_extension as cpp_extension

    if levers is None and os.environ.get(LEVERS_ENV):
        levers = json.loads(os.environ[LEVERS_ENV])
    if isinstance(levers, dict) or levers is None:
        levers = BuildLevers.from_dict(levers)
    recorder = BuildRecorder(levers=levers)
    real_inline = getattr(cpp_extension.load_inline, "__cudal1_real__", cpp_extension.load_inline)
    real_load = getattr(cpp_extension.load, "__cudal1_real__", cpp_extension.load)
    can_replay = levers.remember_failures and _install_replay(cpp_extension)

    def call_key(name: Any, sources: Any, args: tuple, kwargs: dict[str, Any]) -> str | None:
        return _call_key(name, sources, args, kwargs) if can_replay else None

    def load_inline(name, cpp_sources, cuda_sources=None, *args, **kwargs):
        if levers.quiet:
            kwargs["verbose"] = False
        failure = _certain_failure(levers, cpp_extension, name, cpp_sources, cuda_sources, kwargs)
        if failure is not None:
            _raise_build_error(recorder, name, *failure)
        if cuda_usable is False and builds_cuda_code(cuda_sources, with_cuda=kwargs.get("with_cuda")):
            _raise_no_gpu(recorder, name)
        remember = call_key(name, [cpp_sources, cuda_sources], args, kwargs)
        output = recorder.remembered_failure(remember) if remember is not None else None
        if output is not None:  # the source as written failed before: torch replays it without compiling
            with _replaying(output):
                return _timed_call(recorder, real_inline, name, "remembered", (name, cpp_sources, cuda_sources, *args),
                                   kwargs)
        light = light_cuda_sources(cuda_sources) if levers.light_cuda_headers and not args else None
        if light is None:
            return _timed_call(recorder, real_inline, name, "original", (name, cpp_sources, cuda_sources, *args),
                               kwargs, remember)
        key = _decision_key(name, cuda_sources)
        lost_s = 0.0
        if recorder.load_decisions().get(key) != "original":
            try:
                module = _timed_call(recorder, real_inline, name, "light", (name, cpp_sources, light), kwargs)
            except Exception:  # noqa: BLE001 - any failure of the light variant means: build as written
                lost_s = recorder.records.pop().seconds  # the fallback below is the build that counts
                _forget_version(cpp_extension, name)
                logger.info("light headers failed for %s; building the source as written", name)
            else:
                recorder.save_decision(key, "light")
                return module
        recorder.save_decision(key, "original")
        try:  # only this build's failure is remembered: the light variant is the hook's, not the candidate's
            return _timed_call(recorder, real_inline, name, "fallback" if lost_s else "original",
                               (name, cpp_sources, cuda_sources), kwargs, remember)
        finally:
            recorder.records[-1].seconds += lost_s  # the failed light attempt is part of the cost

    def load(name, sources, *args, **kwargs):
        if levers.quiet:
            kwargs["verbose"] = False
        if cuda_usable is False and builds_cuda_code(sources=sources, with_cuda=kwargs.get("with_cuda")):
            _raise_no_gpu(recorder, name)
        remember = call_key(name, _file_digests(sources), args, kwargs)
        output = recorder.remembered_failure(remember) if remember is not None else None
        if output is not None:
            with _replaying(output):
                return _timed_call(recorder, real_load, name, "remembered", (name, sources, *args), kwargs)
        return _timed_call(recorder, real_load, name, "original", (name, sources, *args), kwargs, remember)

    load_inline.__cudal1_real__ = real_inline  # type: ignore[attr-defined]
    load.__cudal1_real__ = real_load  # type: ignore[attr-defined]
    cpp_extension.load_inline = load_inline
    cpp_extension.load = load
    return recorder


def _certain_failure(levers: BuildLevers, cpp_extension: Any, name: Any, cpp_sources: Any, cuda_sources: Any,
                     kwargs: dict[str, Any]) -> tuple[str, str] | None:
    """(record variant, compiler log) of a load_inline call certain to fail to build, by the fail-fast levers
    that are on; None when the call should be built."""
    functions = kwargs.get("functions")
    missing = (unbound_functions(cpp_sources, functions, kwargs.get("extra_cflags"))
               if levers.fail_fast_unbound else [])
    if missing:
        return "unbound", unbound_functions_log(name, missing)
    duplicate = (duplicate_module_log(name, cpp_sources, cuda_sources, functions,
                                      name_in_use=_name_in_use(cpp_extension, name))
                 if levers.fail_fast_duplicate_module else "")
    return ("duplicate_module", duplicate) if duplicate else None


def _name_in_use(cpp_extension: Any, name: Any) -> bool:
    """Whether torch may rename a new build of `name` (`<name>_v1`): it loaded one of that name before, or
    its version table cannot be read (then assume so)."""
    entries = getattr(getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None), "entries", None)
    return not isinstance(entries, dict) or name in entries
