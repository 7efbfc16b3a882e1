"""`load_kernels`: compile a CUDA C source (or hit the cache) and launch its kernels on torch's stream.

    kernels = load_kernels(SOURCE)
    kernels.relu_kernel(grid=((n + 255) // 256,), block=(256,), args=(x, y, n))

Each launch goes to `torch.cuda.current_stream()` of the current device, in torch's primary context.
A `stream=` argument is accepted, but a launch on any stream other than the current one is recorded in
the process-wide launch log, which the evaluator reads (`launch_log()`) together with the list of
kernels each source defines: a kernel that is defined but never launched is a decoy, and work on a side
stream escapes timing on the current stream.

Limits: one launch costs tens of microseconds of Python on top of the driver's launch (argument checks
and conversion), comparable to an eager PyTorch op. A grid with a zero dimension launches nothing (an
empty input) but is still recorded. Kernels are looked up by their `extern "C"` name; a kernel that the
signature parser could not see (declared through a macro) still launches, with the untyped argument
rules of `arguments.py`.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cudal1.core.errors import Cudal1Error
from cudal1.raw_cuda.arguments import TensorPointer, make_tensor_pointer, marshal_args
from cudal1.raw_cuda.backend import DEFAULT_DYNAMIC_SHARED_LIMIT_BYTES, DriverBackend
from cudal1.raw_cuda.compiler import DEFAULT_ARCH, compile_only, device_arch
from cudal1.raw_cuda.errors import RawCudaLaunchError
from cudal1.raw_cuda.signature import KernelSignature, parse_kernel_signatures

logger = logging.getLogger(__name__)

# CUDA's launch limits (all architectures since sm_30): threads per block, block and grid extents.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIMS = (1024, 1024, 64)
MAX_GRID_DIMS = (2**31 - 1, 65535, 65535)


# ----------------------------------------------------------------------------------------------------
# Launch log
# ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LaunchLog:
    """A snapshot of the launches made through this module since the last reset."""

    by_kernel: dict[str, int]  # kernel name -> launches
    by_stream: dict[int, int]  # raw cudaStream_t handle -> launches (0: the legacy default stream)
    off_current_stream: int  # launches whose stream was not the current stream at launch time
    defined_kernels: tuple[str, ...]  # extern "C" kernels of every source loaded (kept across resets)

    @property
    def total(self) -> int:
        return sum(self.by_kernel.values())

    def never_launched(self) -> list[str]:
        """Kernels that were defined but not launched since the last reset (decoy candidates)."""
        return [k for k in self.defined_kernels if self.by_kernel.get(k, 0) == 0]


class _LaunchRecorder:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_kernel: Counter[str] = Counter()
        self._by_stream: Counter[int] = Counter()
        self._off_stream = 0
        self._defined: dict[str, None] = {}

    def define(self, names: Sequence[str]) -> None:
        with self._lock:
            self._defined.update(dict.fromkeys(names))

    def record(self, kernel: str, stream_handle: int, off_current: bool) -> None:
        with self._lock:
            self._by_kernel[kernel] += 1
            self._by_stream[stream_handle] += 1
            self._off_stream += int(off_current)

    def snapshot(self) -> LaunchLog:
        with self._lock:
            return LaunchLog(dict(self._by_kernel), dict(self._by_stream), self._off_stream,
                             tuple(self._defined))

    def reset(self, forget_defined: bool) -> None:
        with self._lock:
            self._by_kernel.clear()
            self._by_stream.clear()
            self._off_stream = 0
            if forget_defined:
                self._defined.clear()


_RECORDER = _LaunchRecorder()


def launch_log() -> LaunchLog:
    """Counts of raw-CUDA launches per kernel name and per stream handle, and the defined kernels."""
    return _RECORDER.snapshot()


def reset_launch_log(*, forget_defined: bool = False) -> None:
    """Zero the launch counts (the evaluator does this before the runs it inspects)."""
    _RECORDER.reset(forget_defined)


# ----------------------------------------------------------------------------------------------------
# Runtime: what a launch needs from torch and the driver (injectable for CPU tests)
# ----------------------------------------------------------------------------------------------------

@dataclass
class Runtime:
    """The device-facing half of a launch. `torch_runtime()` builds the real one."""

    backend: Any  # DriverBackend or a test double with the same methods
    current_device: Callable[[], int]
    current_stream_handle: Callable[[int], int]  # device index -> raw handle of torch's current stream
    tensor_pointer: Callable[[int], TensorPointer]  # device index -> checked tensor -> pointer


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def torch_runtime() -> Runtime:
    """The process-wide runtime on torch's CUDA state and cuda.bindings.driver (created on first use)."""
    global _runtime
    if _runtime is None:
        import torch


        with _runtime_lock:
            if _runtime is None:
                if not torch.cuda.is_available():
                    raise RawCudaLaunchError("CUDA is not available: raw kernels can be compiled "
                                             "(compile_only) but not launched on this machine")
                torch.cuda.init()  # torch creates the primary context that the kernels share
                _runtime = Runtime(
                    backend=DriverBackend(),
                    current_device=torch.cuda.current_device,
                    current_stream_handle=lambda dev: int(torch.cuda.current_stream(dev).cuda_stream),
                    tensor_pointer=make_tensor_pointer,
                )
    return _runtime


# ----------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------

def normalize_dims(value: int | Sequence[int], what: str, kernel: str) -> tuple[int, int, int]:
    """(x, y, z) from an int or a 1-3 tuple; checks CUDA's extents."""
    try:
        items = tuple(value) if isinstance(value, Sequence) else (value,)
        if not 1 <= len(items) <= 3 or any(isinstance(d, bool) for d in items):
            raise TypeError
        dims = tuple(operator.index(d) for d in items)
    except TypeError:
        raise RawCudaLaunchError(f"{kernel}: {what}={value!r}; give an int or a tuple of 1 to 3 ints",
                                 kernel=kernel) from None
    xyz = (*dims, *(1,) * (3 - len(dims)))
    limits = MAX_GRID_DIMS if what == "grid" else MAX_BLOCK_DIMS
    low = 1 if what == "block" else 0
    for axis, (d, lim) in enumerate(zip(xyz, limits, strict=True)):
        if not low <= d <= lim:
            raise RawCudaLaunchError(f"{kernel}: {what} dimension {'xyz'[axis]} is {d}; allowed {low}..{lim}",
                                     kernel=kernel)
    if what == "block" and xyz[0] * xyz[1] * xyz[2] > MAX_THREADS_PER_BLOCK:
        raise RawCudaLaunchError(f"{kernel}: block {dims} has {xyz[0] * xyz[1] * xyz[2]} threads; the limit "
                                 f"is {MAX_THREADS_PER_BLOCK}", kernel=kernel)
    return xyz


def stream_handle_of(stream: object) -> int:
    """The raw cudaStream_t of a torch.cuda.Stream, an int handle, or a `__cuda_stream__` object."""
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    raise TypeError(f"stream={stream!r}: give a torch.cuda.Stream (or leave it out for the current stream)")


class RawKernel:
    """One kernel of a KernelSet; call it with grid=, block=, args=."""

    def __init__(self, owner: KernelSet, name: str, signature: KernelSignature | None):
        self.name = name
        self.signature = signature
        self._owner = owner
        self._functions: dict[int, object] = {}
        self._shared_allowed: dict[int, int] = {}

    def __repr__(self) -> str:
        sig = self.signature.describe() if self.signature else f"{self.name}(...)"
        return f"<raw CUDA kernel {sig}>"

    def _function(self, runtime: Runtime, device: int) -> object:
        func = self._functions.get(device)
        if func is None:
            func = runtime.backend.get_function(self._owner._module(runtime, device), self.name)
            if func is None:
                raise RawCudaLaunchError(f"kernel '{self.name}' is not in the compiled module", kernel=self.name)
            self._functions[device] = func
        return func

    def __call__(self, *, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any] = (),
                 shared_mem_bytes: int = 0, stream: object = None, allow_strided: bool = False) -> None:
        """Launch on torch's current stream (see the module docstring for `stream=`)."""
        grid3 = normalize_dims(grid, "grid", self.name)
        block3 = normalize_dims(block, "block", self.name)
        if not isinstance(shared_mem_bytes, int) or shared_mem_bytes < 0:
            raise RawCudaLaunchError(f"{self.name}: shared_mem_bytes={shared_mem_bytes!r}; give an int >= 0",
                                     kernel=self.name)
        runtime = self._owner._get_runtime()
        device = runtime.current_device()
        current = runtime.current_stream_handle(device)
        handle = current if stream is None else stream_handle_of(stream)
        params = self.signature.params if self.signature is not None else None
        cargs = marshal_args(self.name, params, tuple(args), tensor_pointer=runtime.tensor_pointer(device),
                             allow_strided=allow_strided)
        if handle != current:
            logger.debug("raw_cuda: %s launched on stream %#x, not the current stream %#x", self.name, handle,
                         current)
        if 0 not in grid3:
            func = self._function(runtime, device)
            if shared_mem_bytes > max(DEFAULT_DYNAMIC_SHARED_LIMIT_BYTES, self._shared_allowed.get(device, 0)):
                runtime.backend.allow_dynamic_shared(func, shared_mem_bytes, self.name)
                self._shared_allowed[device] = shared_mem_bytes
            runtime.backend.launch(func, self.name, grid3, block3, shared_mem_bytes, handle, cargs, device)
        _RECORDER.record(self.name, handle, handle != current)


class KernelSet:
    """The kernels of one compiled source: `kernels.<name>(grid=..., block=..., args=...)`."""

    def __init__(self, cubin: bytes, signatures: dict[str, KernelSignature], *, key: str = "",
                 runtime: Runtime | None = None):
        self._cubin = cubin
        self._signatures = signatures
        self._key = key
        self._runtime = runtime
        self._modules: dict[int, object] = {}
        self._kernels: dict[str, RawKernel] = {}
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        """The extern "C" kernels found in the source."""
        return [n for n, s in self._signatures.items() if s.extern_c]

    def _get_runtime(self) -> Runtime:
        return self._runtime if self._runtime is not None else torch_runtime()

    def _module(self, runtime: Runtime, device: int) -> object:
        with self._lock:
            if device not in self._modules:
                self._modules[device] = runtime.backend.load_module(self._cubin, device)
            return self._modules[device]

    def _missing(self, name: str) -> AttributeError:
        msg = f"no kernel '{name}'; available: {', '.join(self.names) or '(none)'}"
        sig = self._signatures.get(name)
        if sig is not None and not sig.extern_c:
            msg += f". '{name}' is not extern \"C\" (or is a template): declare it extern \"C\" __global__"
        return AttributeError(msg)

    def __getattr__(self, name: str) -> RawKernel:
        if name.startswith("_"):
            raise AttributeError(name)
        kernel = self._kernels.get(name)
        if kernel is not None:
            return kernel
        sig = self._signatures.get(name)
        if sig is None or not sig.extern_c:
            if not self._symbol_in_module(name):
                raise self._missing(name)
            sig = None  # in the binary but not seen by the parser (e.g. declared through a macro)
        kernel = RawKernel(self, name, sig)
        self._kernels[name] = kernel
        return kernel

    def _symbol_in_module(self, name: str) -> bool:
        """Ask the loaded module (GPU only) whether it has `name`; False when no GPU is usable."""
        try:
            runtime = self._get_runtime()
            device = runtime.current_device()
            return runtime.backend.get_function(self._module(runtime, device), name) is not None
        except Cudal1Error:  # no GPU, no driver, or no cuda-python: the parser's list is all we know
            return False

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.names))

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def __repr__(self) -> str:
        return f"<KernelSet {self._key[:12]}: {', '.join(self.names)}>"


_kernel_sets: dict[str, KernelSet] = {}
_kernel_sets_lock = threading.Lock()


def load_kernels(source: str, options: Sequence[str] | str = (), *, arch: str | None = None,
                 compiler: str = "auto", cache_dir: str | os.PathLike[str] | None = None,
                 use_cache: bool = True) -> KernelSet:
    """Compile `source` (plain CUDA C, `extern "C" __global__` kernels) and return its kernels.

    `arch` defaults to the current GPU's (`sm_90` without a GPU); `compiler` is "auto" (NVRTC, else
    nvcc), "nvrtc" or "nvcc". Results are cached by content hash in memory and on disk, and the same
    source loaded twice in a process returns the same KernelSet. Raises RawCudaCompileError with the
    trimmed compiler log when the source does not compile.
    """
    arch = arch or device_arch(DEFAULT_ARCH)
    result = compile_only(source, options=options, arch=arch, compiler=compiler, cache_dir=cache_dir,
                          use_cache=use_cache)
    with _kernel_sets_lock:
        kernels = _kernel_sets.get(result.key) if use_cache else None
        if kernels is None:
            kernels = KernelSet(result.cubin_bytes, parse_kernel_signatures(source), key=result.key)
            if use_cache:
                _kernel_sets[result.key] = kernels
    _RECORDER.define(kernels.names)
    return kernels
