"""Load CUBINs and launch kernels through NVIDIA's `cuda.bindings.driver`, in torch's primary context.

Why the driver bindings and not `cuda.core`: `cuda.core` moved its API from `cuda.core.experimental` (0.3)
to `cuda.core` (1.x) and changed how foreign streams are accepted between those versions, while the
driver calls used here (cuModuleLoadData, cuModuleGetFunction, cuFuncSetAttribute, cuLaunchKernel,
cuDevicePrimaryCtxRetain) have the same Python signatures in cuda-python 12.x and 13.x. They also let a
launch go straight onto torch's stream handle without a wrapper object per stream.

Context: torch uses each device's primary context; before loading or launching, the primary context of
the target device is made current on the calling thread if it is not already.

Limits: modules are never unloaded (a few KB of device memory per distinct source, for the life of the
process; evaluator runners are short-lived). Needs a CUDA driver; nothing here runs on a CPU machine.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from cudal1.raw_cuda.arguments import CArg, to_ctypes
from cudal1.raw_cuda.compiler import cuda_bindings
from cudal1.raw_cuda.errors import RawCudaLaunchError

# The driver's default cap on dynamic shared memory; above it the kernel must opt in by attribute.
DEFAULT_DYNAMIC_SHARED_LIMIT_BYTES = 48 * 1024


class DriverBackend:
    """Module loading and kernel launch with `cuda.bindings.driver`."""

    def __init__(self) -> None:
        self._drv = cuda_bindings("driver", "launching raw CUDA kernels")
        self._lock = threading.Lock()
        self._primary: dict[int, object] = {}
        self._streams: dict[int, object] = {}
        try:
            result = self._drv.cuInit(0)
        except Exception as exc:  # noqa: BLE001 - no libcuda: pathfinder/loader errors of several types
            raise RawCudaLaunchError(f"the CUDA driver is not available: {exc}") from None
        self._check(result, "cuInit")

    def _check(self, result, what: str, kernel: str = ""):
        """Raise RawCudaLaunchError for a failed driver call; return its outputs otherwise."""
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            name = self._drv.cuGetErrorName(err)[1]
            text = name.decode() if isinstance(name, bytes) else str(err)
            prefix = f"{kernel}: " if kernel else ""
            raise RawCudaLaunchError(f"{prefix}{what} failed: {text}", kernel=kernel)
        if not isinstance(result, tuple) or len(result) == 1:
            return None
        return result[1] if len(result) == 2 else result[1:]

    def ensure_context(self, device_index: int) -> None:
        """Make `device_index`'s primary context (torch's) current on this thread."""
        ctx = self._primary.get(device_index)
        if ctx is None:
            with self._lock:
                dev = self._check(self._drv.cuDeviceGet(device_index), "cuDeviceGet")
                ctx = self._check(self._drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
                self._primary[device_index] = ctx
        current = self._check(self._drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if current is None or int(current) != int(ctx):
            self._check(self._drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def load_module(self, cubin: bytes, device_index: int) -> object:
        """Load a CUBIN into the device's primary context."""
        self.ensure_context(device_index)
        return self._check(self._drv.cuModuleLoadData(cubin), "cuModuleLoadData")

    def get_function(self, module: object, name: str) -> object | None:
        """The kernel `name` of `module`, or None when the module has no such symbol."""
        result = self._drv.cuModuleGetFunction(module, name.encode())
        if int(result[0]) == int(self._drv.CUresult.CUDA_ERROR_NOT_FOUND):
            return None
        return self._check(result, "cuModuleGetFunction", name)

    def allow_dynamic_shared(self, func: object, nbytes: int, kernel: str) -> None:
        """Let `func` use `nbytes` of dynamic shared memory (needed above 48 KiB)."""
        attr = self._drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._check(self._drv.cuFuncSetAttribute(func, attr, int(nbytes)), "cuFuncSetAttribute", kernel)

    def _stream(self, handle: int) -> object:
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._drv.CUstream(handle)
            self._streams[handle] = stream
        return stream

    def launch(self, func: object, kernel: str, grid: Sequence[int], block: Sequence[int],
               shared_mem_bytes: int, stream_handle: int, cargs: Sequence[CArg], device_index: int) -> None:
        """Enqueue one launch on the stream whose raw handle is `stream_handle`."""
        self.ensure_context(device_index)
        params = to_ctypes(cargs) if cargs else 0
        result = self._drv.cuLaunchKernel(func, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                          int(shared_mem_bytes), self._stream(stream_handle), params, 0)
        self._check(result, "cuLaunchKernel", kernel)
