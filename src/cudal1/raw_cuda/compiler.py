"""Compile plain CUDA C source to a CUBIN with NVRTC (in process) or `nvcc -cubin`, cached by content hash.

Runs without a GPU: the target arch is given (`sm_90` by default), NVRTC is a host library
(`cuda.bindings.nvrtc`, with libnvrtc from the CUDA toolkit or the `nvidia-cuda-nvrtc` wheel), and the
output is a CUBIN, so the driver does no JIT at load time.

Compiler command lines:
- nvrtc: `--gpu-architecture=sm_XX -std=c++17 -I<toolkit include> [-I<include>/cccl] <options>`, plus the
  headers of `shims.py` (so `<cstdint>`, `<cmath>` ... resolve) and a prelude defining `int64_t` & co.
- nvcc: `nvcc -cubin -arch=sm_XX -std=c++17 <options> -o kernel.cubin kernel.cu` in a temporary folder.
`--use_fast_math` is not added: FP32 results stay IEEE-accurate unless the caller asks for it.

Cache: the CUBIN is keyed by sha256 of (source, options, arch, compiler name and version, cache format),
kept in memory (per process, LRU) and on disk in `<cache_dir>/<key>.cubin`, where `cache_dir` is the
argument, else `$CUDAL1_CACHE_DIR/raw_cuda`, else `~/.cache/cudal1/raw_cuda`; disk writes are atomic
(temporary file + os.replace), so concurrent processes can share the folder.

Limits: NVRTC runs in the calling process and cannot be interrupted; the evaluator runs untrusted
candidates in a child process with a time limit. nvcc runs with `nvcc_timeout_s`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import types
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cudal1.core.errors import ConfigError, MissingDependencyError
from cudal1.core.files import write_atomically
from cudal1.raw_cuda.errors import RawCudaCompileError, trim_compile_log
from cudal1.raw_cuda.shims import NVRTC_PRELUDE, NVRTC_SHIM_HEADERS

logger = logging.getLogger(__name__)

COMPILERS = ("auto", "nvrtc", "nvcc")
DEFAULT_ARCH = "sm_90"  # H100/H200: the project's reference GPUs
DEFAULT_OPTIONS = ("-std=c++17",)
SOURCE_NAME = "kernel.cu"
NVCC_TIMEOUT_S = 120.0
# Bump when the compile recipe (prelude, shims, default options) changes, so stale CUBINs are not reused.
CACHE_FORMAT = 1
MEMORY_CACHE_ENTRIES = 512

_ARCH_FLAGS = re.compile(r"^(?:-arch|--gpu-architecture|-gencode|--generate-code|-code|--gpu-code)\b")

_memory_cache: OrderedDict[str, bytes] = OrderedDict()
_memory_lock = threading.Lock()


@dataclass(frozen=True)
class CompileResult:
    """A compiled CUBIN and how it was obtained."""

    cubin_bytes: bytes
    log: str  # compiler warnings (empty on a cache hit)
    seconds: float  # wall time of this call, compile or cache lookup
    cache_hit: bool
    arch: str  # e.g. "sm_90"
    compiler: str  # e.g. "nvrtc 13.0" or "nvcc 13.0.88"
    key: str  # the sha256 cache key


def normalize_arch(arch: str | int | tuple[int, int]) -> str:
    """'sm_90' from 'sm_90', '90', 90, '9.0' or (9, 0); keeps a suffix such as 'sm_90a'."""
    if isinstance(arch, tuple):
        return f"sm_{arch[0]}{arch[1]}"
    text = str(arch).strip().lower()
    m = re.fullmatch(r"(?:sm_?)?(\d{2,3}[a-z]?)|(\d+)\.(\d)", text)
    if m is None:
        raise ConfigError(f"arch {arch!r} is not a CUBIN target; use a form like 'sm_90'")
    return f"sm_{m.group(1)}" if m.group(1) else f"sm_{m.group(2)}{m.group(3)}"


def device_arch(default: str = DEFAULT_ARCH) -> str:
    """The arch of torch's current CUDA device, or `default` when there is no GPU."""
    import torch

    if torch.cuda.is_available():
        return normalize_arch(torch.cuda.get_device_capability(torch.cuda.current_device()))
    return normalize_arch(default)


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The on-disk CUBIN cache folder (see the module docstring for the order of precedence)."""
    if cache_dir is not None:
        return Path(cache_dir)
    root = os.environ.get("CUDAL1_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "cudal1"
    return base / "raw_cuda"


def _normalize_options(options: Sequence[str] | str) -> tuple[str, ...]:
    opts = tuple(shlex.split(options)) if isinstance(options, str) else tuple(str(o) for o in options)
    for opt in opts:
        if _ARCH_FLAGS.match(opt):
            raise ConfigError(f"option {opt!r}: give the target with arch='sm_XX', not in options")
    return opts


@functools.lru_cache(maxsize=1)
def cuda_include_dirs() -> tuple[str, ...]:
    """CUDA toolkit header folders for NVRTC: cuda.pathfinder's answer, else CUDA_HOME/CUDA_PATH, else
    /usr/local/cuda/include; plus its `cccl` subfolder (libcu++) where the toolkit has one."""
    found: list[str] = []
    try:
        from cuda import pathfinder

        for lib in ("cudart", "cccl"):
            try:
                d = pathfinder.find_nvidia_header_directory(lib)
            except Exception:  # noqa: BLE001 - older pathfinder versions reject unknown names
                d = None
            if d:
                found.append(str(d))
    except ImportError:
        pass
    if not found:
        for env in ("CUDA_HOME", "CUDA_PATH"):
            if os.environ.get(env):
                found.append(os.path.join(os.environ[env], "include"))
        found.append("/usr/local/cuda/include")
    dirs: list[str] = []
    for d in found:
        for cand in (d, os.path.join(d, "cccl")):
            if os.path.isdir(cand) and cand not in dirs:
                dirs.append(cand)
    return tuple(dirs)


def cuda_bindings(module: str, purpose: str) -> types.ModuleType:
    """`cuda.bindings.<module>` (cuda-python >= 12.6; before that `cuda.cuda` for the driver, `cuda.<module>`
    otherwise), or `MissingDependencyError` naming the `cuda` extra and what it was needed for."""
    for name in (f"cuda.bindings.{module}", "cuda.cuda" if module == "driver" else f"cuda.{module}"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise MissingDependencyError("cuda-python", "cuda", purpose)


def _nvrtc() -> types.ModuleType:
    return cuda_bindings("nvrtc", "compiling raw CUDA kernels")


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str | None:
    """'13.0' for the loadable libnvrtc, or None when NVRTC is not usable here."""
    try:
        err, major, minor = _nvrtc().nvrtcVersion()
    except Exception as exc:  # noqa: BLE001 - a missing libnvrtc surfaces as various errors
        logger.debug("NVRTC unavailable: %s", exc)
        return None
    return f"{major}.{minor}" if int(err) == 0 else None


def nvcc_path() -> str | None:
    """The nvcc on PATH, else under CUDA_HOME/CUDA_PATH, else None."""
    found = shutil.which("nvcc")
    if found:
        return found
    for env in ("CUDA_HOME", "CUDA_PATH"):
        cand = os.path.join(os.environ.get(env, ""), "bin", "nvcc")
        if os.environ.get(env) and os.access(cand, os.X_OK):
            return cand
    return None


@functools.lru_cache(maxsize=4)
def nvcc_version(path: str) -> str:
    """'13.0.88' from `nvcc --version`."""
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def _pick_compiler(compiler: str) -> tuple[str, str]:
    """(name, version) of the compiler to use; 'auto' prefers NVRTC."""
    if compiler not in COMPILERS:
        raise ConfigError(f"compiler={compiler!r}; choose one of {', '.join(COMPILERS)}")
    if compiler in ("auto", "nvrtc"):
        version = nvrtc_version()
        if version is not None:
            return "nvrtc", version
        if compiler == "nvrtc":
            raise MissingDependencyError("nvidia-cuda-nvrtc", "cuda", "NVRTC (libnvrtc was not found)")
    path = nvcc_path()
    if path is None:
        raise RawCudaCompileError("no CUDA compiler: NVRTC is not loadable and nvcc is not on PATH",
                                  compiler=compiler)
    return "nvcc", nvcc_version(path)


def cache_key(source: str, options: Sequence[str], arch: str, compiler: str, version: str) -> str:
    """sha256 over everything that determines the CUBIN."""
    blob = json.dumps([CACHE_FORMAT, source, list(options), arch, compiler, version])
    return hashlib.sha256(blob.encode()).hexdigest()


def _check(nvrtc, result) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RawCudaCompileError(f"NVRTC call failed: {nvrtc.nvrtcGetErrorString(err)[1].decode()}",
                                  compiler="nvrtc")


def _program_log(nvrtc, prog) -> str:
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    # A fresh mutable buffer: NVRTC writes into it. (The common `b" " * size` idiom hands NVRTC CPython's
    # shared one-byte object when the log is empty, and overwriting it corrupts b" " process-wide.)
    buf = bytearray(size)
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.replace(b"\x00", b"").decode(errors="replace").strip()


def _compile_nvrtc(source: str, options: tuple[str, ...], arch: str) -> tuple[bytes, str]:
    nvrtc = _nvrtc()
    arch_num = int(re.sub(r"\D", "", arch))
    err, supported = nvrtc.nvrtcGetSupportedArchs()
    if int(err) == 0 and supported and arch_num not in list(supported):
        raise RawCudaCompileError(f"NVRTC {nvrtc_version()} cannot build {arch}; it supports sm_"
                                  + ", sm_".join(str(a) for a in supported), compiler="nvrtc")
    names = [n.encode() for n in NVRTC_SHIM_HEADERS]
    bodies = [b.encode() for b in NVRTC_SHIM_HEADERS.values()]
    text = NVRTC_PRELUDE.format(name=SOURCE_NAME) + source
    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), SOURCE_NAME.encode(), len(names), bodies, names)
    _check(nvrtc, err)
    try:
        opts = [f"--gpu-architecture={arch}", *DEFAULT_OPTIONS, *(f"-I{d}" for d in cuda_include_dirs()),
                *options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = _program_log(nvrtc, prog)
        if int(err) != 0:
            detail = log or nvrtc.nvrtcGetErrorString(err)[1].decode()
            raise RawCudaCompileError(trim_compile_log(detail), log=detail, compiler="nvrtc")
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = bytearray(size)
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin))
        return bytes(cubin), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_nvcc(source: str, options: tuple[str, ...], arch: str, timeout_s: float) -> tuple[bytes, str]:
    path = nvcc_path()
    if path is None:
        raise RawCudaCompileError("nvcc is not on PATH", compiler="nvcc")
    with tempfile.TemporaryDirectory(prefix="cudal1_nvcc_") as tmp:
        Path(tmp, SOURCE_NAME).write_text(source)
        cmd = [path, "-cubin", f"-arch={arch}", *DEFAULT_OPTIONS, *options, "-o", "kernel.cubin", SOURCE_NAME]
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RawCudaCompileError(f"nvcc timed out after {timeout_s:.0f} s", compiler="nvcc") from None
        log = (proc.stderr + proc.stdout).strip()
        if proc.returncode != 0:
            raise RawCudaCompileError(trim_compile_log(log) or f"nvcc exited with {proc.returncode}",
                                      log=log, compiler="nvcc")
        return Path(tmp, "kernel.cubin").read_bytes(), log


def _cache_get(key: str, disk_dir: Path | None) -> bytes | None:
    with _memory_lock:
        if key in _memory_cache:
            _memory_cache.move_to_end(key)
            return _memory_cache[key]
    if disk_dir is None:
        return None
    try:
        data = (disk_dir / f"{key}.cubin").read_bytes()
    except OSError:
        return None
    if data:
        _memory_put(key, data)
        return data
    return None


def _memory_put(key: str, cubin: bytes) -> None:
    with _memory_lock:
        _memory_cache[key] = cubin
        _memory_cache.move_to_end(key)
        while len(_memory_cache) > MEMORY_CACHE_ENTRIES:
            _memory_cache.popitem(last=False)


def _disk_put(key: str, cubin: bytes, disk_dir: Path) -> None:
    try:
        write_atomically(disk_dir / f"{key}.cubin", cubin)
    except OSError as exc:  # a read-only or full cache folder must not fail the build
        logger.warning("raw_cuda: could not write the CUBIN cache in %s: %s", disk_dir, exc)


def clear_memory_cache() -> None:
    """Forget the in-process CUBIN cache (the disk cache stays)."""
    with _memory_lock:
        _memory_cache.clear()


def compile_only(source: str, *, options: Sequence[str] | str = (), arch: str = DEFAULT_ARCH,
                 compiler: str = "auto", cache_dir: str | os.PathLike[str] | None = None,
                 use_cache: bool = True, nvcc_timeout_s: float = NVCC_TIMEOUT_S) -> CompileResult:
    """Compile `source` to a CUBIN for `arch` (no GPU needed), or fetch it from the cache.

    `compiler` is "nvrtc", "nvcc" or "auto" (NVRTC when loadable, else nvcc). `use_cache=False` skips
    both caches. Raises RawCudaCompileError (message: the trimmed log) when the source does not compile.
    """
    start = time.perf_counter()
    arch = normalize_arch(arch)
    opts = _normalize_options(options)
    name, version = _pick_compiler(compiler)
    key = cache_key(source, opts, arch, name, version)
    disk_dir = resolve_cache_dir(cache_dir) if use_cache else None
    label = f"{name} {version}"
    if use_cache:
        cached = _cache_get(key, disk_dir)
        if cached is not None:
            seconds = time.perf_counter() - start
            logger.debug("raw_cuda: cache hit %s (%.1f ms)", key[:12], seconds * 1e3)
            return CompileResult(cached, "", seconds, True, arch, label, key)
    if name == "nvrtc":
        cubin, log = _compile_nvrtc(source, opts, arch)
    else:
        cubin, log = _compile_nvcc(source, opts, arch, nvcc_timeout_s)
    if use_cache:
        _memory_put(key, cubin)
        assert disk_dir is not None
        _disk_put(key, cubin, disk_dir)
    seconds = time.perf_counter() - start
    logger.debug("raw_cuda: built %s with %s for %s in %.3f s", key[:12], label, arch, seconds)
    return CompileResult(cubin, log, seconds, False, arch, label, key)
