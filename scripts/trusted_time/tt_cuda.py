"""The CUDA driver API through ctypes (no cuda-python on the GPU machine), and a stand-in for CPU dry runs.

`Cuda` wraps the few driver calls the experiments use in Python methods (pointers are ints, handles are
ints, errors raise `CudaError` with the call's name and CUresult). `FakeCuda` has the same methods over host
memory: kernels do nothing, stream waits return at once, events read the host clock; it lets a dry run on a
CPU machine exercise every process, socket, descriptor and JSON path of the experiments.

The VMM structures are the project's own (`cudal1.eval.shared.cuda_vmm`).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from ctypes import POINTER, c_char_p, c_float, c_int, c_size_t, c_uint, c_uint32, c_uint64, c_void_p
from typing import Any

from cudal1.eval.shared.cuda_vmm import (
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    CU_MEM_ALLOC_GRANULARITY_MINIMUM,
    CU_MEM_ALLOCATION_TYPE_PINNED,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    CU_MEM_LOCATION_TYPE_DEVICE,
    _AccessDesc,
    _AllocationProp,
    _Location,
)

# Enum values (cuda.h of CUDA 13.0; tests/eval/test_trusted_time_experiments.py checks them against it).
CU_STREAM_NON_BLOCKING = 0x1
CU_EVENT_DEFAULT = 0x0
CU_EVENT_DISABLE_TIMING = 0x2
CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0
CU_FUNC_ATTRIBUTE_NUM_REGS = 4
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1
CU_ACCESS_PROPERTY_NORMAL = 0
CU_ACCESS_PROPERTY_STREAMING = 1
CU_ACCESS_PROPERTY_PERSISTING = 2
CUDA_ERROR_NOT_READY = 600

ATTRIBUTES = {
    "clock_khz": 13,
    "sm_count": 16,
    "cc_major": 75,
    "cc_minor": 76,
    "l2_bytes": 38,
    "max_threads_per_sm": 39,
    "smem_per_sm": 81,
    "cooperative_launch": 95,
    "smem_optin": 97,
    "vmm": 102,
    "posix_fd_handles": 103,
    "max_persisting_l2": 108,
    "max_access_policy_window": 109,
    "reserved_smem_per_block": 111,
    "stream_wait_value_nor": 123,
    "mps_enabled": 133,
}


class CudaError(RuntimeError):
    """A driver call failed."""

    def __init__(self, name: str, code: int, text: str = ""):
        super().__init__(f"{name} failed: CUresult {code} {text}".strip())
        self.name, self.code, self.text = name, code, text


class _AccessPolicyWindow(ctypes.Structure):
    _fields_ = [("base_ptr", c_void_p), ("num_bytes", c_size_t), ("hitRatio", c_float), ("hitProp", c_int),
                ("missProp", c_int)]


class _StreamAttrValue(ctypes.Union):
    """CUstreamAttrValue (CUlaunchAttributeValue): a 64-byte union; only the access-policy window is used."""

    _fields_ = [("accessPolicyWindow", _AccessPolicyWindow), ("pad", ctypes.c_char * 64)]


class _CheckpointArgs(ctypes.Structure):
    """CUcheckpointLockArgs (timeoutMs, reserved0, reserved1[7]); the unlock arguments are 64 zero bytes too."""

    _fields_ = [("timeoutMs", c_uint), ("reserved0", c_uint), ("reserved1", c_uint64 * 7)]


_P = POINTER
SIGNATURES: dict[str, list[Any]] = {
    "cuInit": [c_uint],
    "cuDriverGetVersion": [_P(c_int)],
    "cuDeviceGet": [_P(c_int), c_int],
    "cuDeviceGetAttribute": [_P(c_int), c_int, c_int],
    "cuDeviceGetName": [c_char_p, c_int, c_int],
    "cuDevicePrimaryCtxRetain": [_P(c_void_p), c_int],
    "cuCtxSetCurrent": [c_void_p],
    "cuCtxGetCurrent": [_P(c_void_p)],
    "cuCtxSynchronize": [],
    "cuCtxSetLimit": [c_int, c_size_t],
    "cuCtxGetLimit": [_P(c_size_t), c_int],
    "cuCtxResetPersistingL2Cache": [],
    "cuStreamCreate": [_P(c_void_p), c_uint],
    "cuStreamSynchronize": [c_void_p],
    "cuStreamQuery": [c_void_p],
    "cuStreamWaitEvent": [c_void_p, c_void_p, c_uint],
    "cuStreamSetAttribute": [c_void_p, c_int, c_void_p],
    "cuStreamWaitValue32_v2": [c_void_p, c_uint64, c_uint32, c_uint],
    "cuStreamWriteValue32_v2": [c_void_p, c_uint64, c_uint32, c_uint],
    "cuEventCreate": [_P(c_void_p), c_uint],
    "cuEventRecord": [c_void_p, c_void_p],
    "cuEventSynchronize": [c_void_p],
    "cuEventQuery": [c_void_p],
    "cuEventElapsedTime_v2": [_P(c_float), c_void_p, c_void_p],
    "cuMemAlloc_v2": [_P(c_uint64), c_size_t],
    "cuMemFree_v2": [c_uint64],
    "cuMemcpyHtoD_v2": [c_uint64, c_void_p, c_size_t],
    "cuMemcpyDtoH_v2": [c_void_p, c_uint64, c_size_t],
    "cuMemcpyDtoDAsync_v2": [c_uint64, c_uint64, c_size_t, c_void_p],
    "cuMemsetD32_v2": [c_uint64, c_uint, c_size_t],
    "cuMemsetD32Async": [c_uint64, c_uint, c_size_t, c_void_p],
    "cuModuleLoadData": [_P(c_void_p), c_void_p],
    "cuModuleGetFunction": [_P(c_void_p), c_void_p, c_char_p],
    "cuFuncSetAttribute": [c_void_p, c_int, c_int],
    "cuFuncGetAttribute": [_P(c_int), c_int, c_void_p],
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": [_P(c_int), c_void_p, c_int, c_size_t],
    "cuLaunchKernel": [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p, c_void_p,
                       c_void_p],
    "cuLaunchCooperativeKernel": [c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p,
                                  c_void_p],
    "cuGetErrorName": [c_int, _P(c_char_p)],
    "cuMemCreate": [_P(c_uint64), c_size_t, c_void_p, c_uint64],
    "cuMemExportToShareableHandle": [c_void_p, c_uint64, c_int, c_uint64],
    "cuMemImportFromShareableHandle": [_P(c_uint64), c_void_p, c_int],
    "cuMemAddressReserve": [_P(c_uint64), c_size_t, c_size_t, c_uint64, c_uint64],
    "cuMemMap": [c_uint64, c_size_t, c_size_t, c_uint64, c_uint64],
    "cuMemSetAccess": [c_uint64, c_size_t, c_void_p, c_size_t],
    "cuMemGetAllocationGranularity": [_P(c_size_t), c_void_p, c_int],
    "cuMemUnmap": [c_uint64, c_size_t],
    "cuMemRelease": [c_uint64],
    "cuMemAddressFree": [c_uint64, c_size_t],
    "cuCheckpointProcessLock": [c_int, c_void_p],
    "cuCheckpointProcessUnlock": [c_int, c_void_p],
    "cuCheckpointProcessGetState": [c_int, _P(c_int)],
}

#: Kernel argument kinds: pointer, 32/64-bit unsigned, 32-bit signed, float.
_ARG_TYPES = {"p": c_uint64, "u32": c_uint32, "u64": c_uint64, "i32": c_int, "f32": c_float}


class Cuda:
    """One process's driver API: a device, its primary context, and Python-level calls."""

    fake = False

    def __init__(self, ordinal: int = 0):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self._fns: dict[str, Any] = {}
        self.ordinal = ordinal
        self.device = -1
        self.ctx = None

    # ------------------------------------------------------------------ plumbing

    def fn(self, name: str) -> Any:
        f = self._fns.get(name)
        if f is None:
            try:
                f = getattr(self.lib, name)
            except AttributeError:
                if not name.endswith("_v2"):
                    raise
                f = getattr(self.lib, name[:-3])  # an older driver: the same call without its version suffix
            f.argtypes = SIGNATURES[name]
            f.restype = c_int
            self._fns[name] = f
        return f

    def error_name(self, code: int) -> str:
        text = c_char_p()
        try:
            if self.fn("cuGetErrorName")(code, ctypes.byref(text)) == 0 and text.value:
                return text.value.decode()
        except (AttributeError, OSError):
            pass
        return ""

    def rc(self, name: str, *args: Any) -> int:
        """The call's CUresult, no raise."""
        return int(self.fn(name)(*args))

    def check(self, name: str, *args: Any) -> None:
        code = self.rc(name, *args)
        if code != 0:
            raise CudaError(name, code, self.error_name(code))

    # ------------------------------------------------------------------ device and context

    def init_only(self) -> None:
        """cuInit without a context (a process that only locks others)."""
        self.check("cuInit", 0)

    def init(self) -> None:
        self.check("cuInit", 0)
        dev, ctx = c_int(), c_void_p()
        self.check("cuDeviceGet", ctypes.byref(dev), self.ordinal)
        self.device = dev.value
        self.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), self.device)
        self.check("cuCtxSetCurrent", ctx)
        self.ctx = ctx.value

    def make_current(self) -> None:
        """Bind the context to the calling thread (a second thread that makes calls)."""
        self.check("cuCtxSetCurrent", c_void_p(self.ctx))

    def driver_version(self) -> int:
        v = c_int()
        self.check("cuDriverGetVersion", ctypes.byref(v))
        return v.value

    def device_name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.check("cuDeviceGetName", buf, 256, self.device)
        return buf.value.decode(errors="replace")

    def attr(self, key: str | int) -> int:
        v = c_int()
        number = ATTRIBUTES[key] if isinstance(key, str) else key
        code = self.rc("cuDeviceGetAttribute", ctypes.byref(v), number, self.device)
        return v.value if code == 0 else -1

    def ctx_sync(self) -> None:
        self.check("cuCtxSynchronize")

    # ------------------------------------------------------------------ streams and events

    def stream(self, flags: int = CU_STREAM_NON_BLOCKING) -> int:
        s = c_void_p()
        self.check("cuStreamCreate", ctypes.byref(s), flags)
        return s.value or 0

    def stream_done(self, stream: int) -> bool:
        code = self.rc("cuStreamQuery", c_void_p(stream))
        if code == 0:
            return True
        if code == CUDA_ERROR_NOT_READY:
            return False
        raise CudaError("cuStreamQuery", code, self.error_name(code))

    def stream_sync(self, stream: int, timeout_s: float | None = None) -> None:
        """Wait for a stream; with a timeout, poll (raises TimeoutError) so a stuck stream never hangs us."""
        if timeout_s is None:
            self.check("cuStreamSynchronize", c_void_p(stream))
            return
        deadline = time.monotonic() + timeout_s
        while not self.stream_done(stream):
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream not done after {timeout_s:.1f} s")
            time.sleep(20e-6)

    def event(self, flags: int = CU_EVENT_DEFAULT) -> int:
        e = c_void_p()
        self.check("cuEventCreate", ctypes.byref(e), flags)
        return e.value or 0

    def record(self, event: int, stream: int) -> None:
        self.check("cuEventRecord", c_void_p(event), c_void_p(stream))

    def wait_event(self, stream: int, event: int) -> None:
        self.check("cuStreamWaitEvent", c_void_p(stream), c_void_p(event), 0)

    def elapsed_ms(self, start: int, end: int) -> float:
        ms = c_float()
        self.check("cuEventElapsedTime_v2", ctypes.byref(ms), c_void_p(start), c_void_p(end))
        return float(ms.value)

    def event_sync(self, event: int) -> None:
        self.check("cuEventSynchronize", c_void_p(event))

    def wait_value(self, stream: int, ptr: int, value: int, flags: int = CU_STREAM_WAIT_VALUE_GEQ) -> None:
        self.check("cuStreamWaitValue32_v2", c_void_p(stream), ptr, value & 0xFFFFFFFF, flags)

    def write_value(self, stream: int, ptr: int, value: int, flags: int = CU_STREAM_WRITE_VALUE_DEFAULT) -> None:
        self.check("cuStreamWriteValue32_v2", c_void_p(stream), ptr, value & 0xFFFFFFFF, flags)

    # ------------------------------------------------------------------ memory

    def alloc(self, nbytes: int) -> int:
        p = c_uint64()
        self.check("cuMemAlloc_v2", ctypes.byref(p), max(int(nbytes), 4))
        return int(p.value)

    def free(self, ptr: int) -> None:
        self.rc("cuMemFree_v2", ptr)

    def htod(self, ptr: int, data: bytes) -> None:
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        self.check("cuMemcpyHtoD_v2", ptr, buf, len(data))

    def dtoh(self, ptr: int, nbytes: int) -> bytes:
        buf = ctypes.create_string_buffer(int(nbytes))
        self.check("cuMemcpyDtoH_v2", buf, ptr, int(nbytes))
        return buf.raw

    def memset32(self, ptr: int, value: int, words: int, stream: int | None = None) -> None:
        if stream is None:
            self.check("cuMemsetD32_v2", ptr, value & 0xFFFFFFFF, int(words))
        else:
            self.check("cuMemsetD32Async", ptr, value & 0xFFFFFFFF, int(words), c_void_p(stream))

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.check("cuMemcpyDtoDAsync_v2", dst, src, int(nbytes), c_void_p(stream))

    # ------------------------------------------------------------------ shared device memory (VMM, POSIX fd)

    def _prop(self) -> _AllocationProp:
        prop = _AllocationProp()
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        prop.location = _Location(CU_MEM_LOCATION_TYPE_DEVICE, self.device)
        return prop

    def _map(self, handle: int, size: int) -> int:
        ptr = c_uint64()
        self.check("cuMemAddressReserve", ctypes.byref(ptr), size, 0, 0, 0)
        self.check("cuMemMap", ptr.value, size, 0, handle, 0)
        access = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, self.device), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        self.check("cuMemSetAccess", ptr.value, size, ctypes.byref(access), 1)
        return int(ptr.value)

    def vmm_export(self, nbytes: int) -> tuple[int, int, int]:
        """A new shareable allocation: (device pointer, size, POSIX descriptor)."""
        prop, gran = self._prop(), c_size_t()
        self.check("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop),
                   CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        size = max(gran.value, -(-int(nbytes) // gran.value) * gran.value)
        handle = c_uint64()
        self.check("cuMemCreate", ctypes.byref(handle), size, ctypes.byref(prop), 0)
        fd = c_int(-1)
        self.check("cuMemExportToShareableHandle", ctypes.byref(fd), handle.value,
                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
        return self._map(handle.value, size), size, fd.value

    def vmm_import(self, fd: int, size: int) -> int:
        handle = c_uint64()
        try:
            self.check("cuMemImportFromShareableHandle", ctypes.byref(handle), c_void_p(fd),
                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        finally:
            os.close(fd)
        return self._map(handle.value, int(size))

    # ------------------------------------------------------------------ modules and launches

    def load_module(self, image: bytes) -> int:
        m = c_void_p()
        buf = ctypes.create_string_buffer(bytes(image), len(image))
        self.check("cuModuleLoadData", ctypes.byref(m), buf)
        return m.value or 0

    def function(self, module: int, name: str) -> int:
        f = c_void_p()
        self.check("cuModuleGetFunction", ctypes.byref(f), c_void_p(module), name.encode())
        return f.value or 0

    def func_attr(self, func: int, attribute: int) -> int:
        v = c_int()
        self.check("cuFuncGetAttribute", ctypes.byref(v), attribute, c_void_p(func))
        return v.value

    def set_max_dynamic_smem(self, func: int, nbytes: int) -> None:
        self.check("cuFuncSetAttribute", c_void_p(func), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes))

    def occupancy(self, func: int, block: int, smem: int) -> int:
        v = c_int()
        self.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", ctypes.byref(v), c_void_p(func), block, smem)
        return v.value

    def launch(self, func: int, grid: tuple[int, int, int] | int, block: tuple[int, int, int] | int,
               args: list[tuple[str, Any]], stream: int, smem: int = 0, cooperative: bool = False) -> None:
        g = (grid, 1, 1) if isinstance(grid, int) else tuple(grid)
        b = (block, 1, 1) if isinstance(block, int) else tuple(block)
        holders = [_ARG_TYPES[kind](value) for kind, value in args]
        params = (c_void_p * max(1, len(holders)))(*[ctypes.addressof(h) for h in holders])
        if cooperative:
            self.check("cuLaunchCooperativeKernel", c_void_p(func), *g, *b, int(smem), c_void_p(stream), params)
        else:
            self.check("cuLaunchKernel", c_void_p(func), *g, *b, int(smem), c_void_p(stream), params, None)

    # ------------------------------------------------------------------ L2 persistence

    def set_limit_persisting(self, nbytes: int) -> int:
        return self.rc("cuCtxSetLimit", CU_LIMIT_PERSISTING_L2_CACHE_SIZE, int(nbytes))

    def get_limit_persisting(self) -> int:
        v = c_size_t()
        code = self.rc("cuCtxGetLimit", ctypes.byref(v), CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        return int(v.value) if code == 0 else -code

    def reset_persisting(self) -> int:
        return self.rc("cuCtxResetPersistingL2Cache")

    def access_window(self, stream: int, ptr: int, nbytes: int, hit_ratio: float, hit_prop: int,
                      miss_prop: int = CU_ACCESS_PROPERTY_STREAMING) -> int:
        value = _StreamAttrValue()
        value.accessPolicyWindow = _AccessPolicyWindow(c_void_p(ptr), nbytes, hit_ratio, hit_prop, miss_prop)
        return self.rc("cuStreamSetAttribute", c_void_p(stream), CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW,
                       ctypes.byref(value))

    # ------------------------------------------------------------------ checkpoint locks (another process)

    def checkpoint_lock(self, pid: int, timeout_ms: int) -> int:
        args = _CheckpointArgs()
        args.timeoutMs = int(timeout_ms)
        return self.rc("cuCheckpointProcessLock", pid, ctypes.byref(args))

    def checkpoint_unlock(self, pid: int) -> int:
        args = (c_uint64 * 8)()
        return self.rc("cuCheckpointProcessUnlock", pid, ctypes.byref(args))

    def checkpoint_state(self, pid: int) -> int:
        """0 running, 1 locked, 2 checkpointed, 3 failed; a negative CUresult when the call failed."""
        v = c_int(-1)
        code = self.rc("cuCheckpointProcessGetState", pid, ctypes.byref(v))
        return v.value if code == 0 else -code


class FakeCuda(Cuda):
    """The same calls over host memory, for a dry run without a GPU (module docstring)."""

    fake = True

    def __init__(self, ordinal: int = 0):  # noqa: D107 - no driver library
        self.ordinal = ordinal
        self.device = 0
        self.ctx = 1
        self._next = 1 << 32
        self._mem: dict[int, bytearray] = {}
        self._events: dict[int, float] = {}
        self._handles = 100
        self._lock = threading.Lock()

    def _handle(self) -> int:
        with self._lock:
            self._handles += 1
            return self._handles

    def _find(self, ptr: int) -> tuple[bytearray, int]:
        for base, buf in self._mem.items():
            if base <= ptr < base + len(buf):
                return buf, ptr - base
        raise CudaError("fake access", 1, f"address {ptr:#x} not allocated")

    def fn(self, name: str) -> Any:  # pragma: no cover - never reached through the methods
        raise CudaError(name, 801, "not in the dry run")

    def rc(self, name: str, *args: Any) -> int:
        return 0

    def init_only(self) -> None:
        return None

    def init(self) -> None:
        return None

    def make_current(self) -> None:
        return None

    def driver_version(self) -> int:
        return 13000

    def device_name(self) -> str:
        return "dry run"

    def attr(self, key: str | int) -> int:
        values = {"sm_count": 4, "l2_bytes": 1 << 20, "smem_optin": 232448, "cooperative_launch": 1,
                  "max_persisting_l2": 1 << 19, "max_access_policy_window": 1 << 20,
                  "mps_enabled": int(bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))),
                  "cc_major": 9, "cc_minor": 0, "vmm": 1, "posix_fd_handles": 1}
        return values.get(key, 1) if isinstance(key, str) else 1

    def ctx_sync(self) -> None:
        return None

    def stream(self, flags: int = CU_STREAM_NON_BLOCKING) -> int:
        return self._handle()

    def stream_done(self, stream: int) -> bool:
        return True

    def stream_sync(self, stream: int, timeout_s: float | None = None) -> None:
        return None

    def event(self, flags: int = CU_EVENT_DEFAULT) -> int:
        return self._handle()

    def record(self, event: int, stream: int) -> None:
        self._events[event] = time.perf_counter()

    def wait_event(self, stream: int, event: int) -> None:
        return None

    def elapsed_ms(self, start: int, end: int) -> float:
        return (self._events.get(end, 0.0) - self._events.get(start, 0.0)) * 1e3

    def event_sync(self, event: int) -> None:
        return None

    def wait_value(self, stream: int, ptr: int, value: int, flags: int = 0) -> None:
        self._find(ptr)

    def write_value(self, stream: int, ptr: int, value: int, flags: int = 0) -> None:
        buf, off = self._find(ptr)
        buf[off:off + 4] = (value & 0xFFFFFFFF).to_bytes(4, "little")

    def alloc(self, nbytes: int) -> int:
        with self._lock:
            ptr = self._next
            self._next += -(-max(int(nbytes), 4) // 4096) * 4096 + 4096
        self._mem[ptr] = bytearray(max(int(nbytes), 4))
        return ptr

    def free(self, ptr: int) -> None:
        self._mem.pop(ptr, None)

    def htod(self, ptr: int, data: bytes) -> None:
        buf, off = self._find(ptr)
        buf[off:off + len(data)] = data

    def dtoh(self, ptr: int, nbytes: int) -> bytes:
        buf, off = self._find(ptr)
        return bytes(buf[off:off + int(nbytes)])

    def memset32(self, ptr: int, value: int, words: int, stream: int | None = None) -> None:
        buf, off = self._find(ptr)
        n = min(int(words), (len(buf) - off) // 4)
        buf[off:off + 4 * n] = (value & 0xFFFFFFFF).to_bytes(4, "little") * n

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.htod(dst, self.dtoh(src, nbytes))

    def vmm_export(self, nbytes: int) -> tuple[int, int, int]:
        size = -(-int(nbytes) // (2 << 20)) * (2 << 20)
        fd = os.memfd_create("tt-fake-vmm", 0)
        os.ftruncate(fd, 4096)
        return self.alloc(size), size, fd

    def vmm_import(self, fd: int, size: int) -> int:
        os.fstat(fd)  # a real descriptor arrived
        os.close(fd)
        return self.alloc(size)

    def load_module(self, image: bytes) -> int:
        if not image:
            raise CudaError("cuModuleLoadData", 200, "CUDA_ERROR_INVALID_IMAGE")
        return self._handle()

    def function(self, module: int, name: str) -> int:
        return self._handle()

    def func_attr(self, func: int, attribute: int) -> int:
        return 16

    def set_max_dynamic_smem(self, func: int, nbytes: int) -> None:
        return None

    def occupancy(self, func: int, block: int, smem: int) -> int:
        return 1

    def launch(self, func: int, grid: Any, block: Any, args: list[tuple[str, Any]], stream: int, smem: int = 0,
               cooperative: bool = False) -> None:
        for kind, value in args:
            _ARG_TYPES[kind](value)  # the same conversions as a real launch

    def set_limit_persisting(self, nbytes: int) -> int:
        return 0

    def get_limit_persisting(self) -> int:
        return 0

    def reset_persisting(self) -> int:
        return 0

    def access_window(self, stream: int, ptr: int, nbytes: int, hit_ratio: float, hit_prop: int,
                      miss_prop: int = CU_ACCESS_PROPERTY_STREAMING) -> int:
        _StreamAttrValue()
        return 0

    def checkpoint_lock(self, pid: int, timeout_ms: int) -> int:
        return 0

    def checkpoint_unlock(self, pid: int) -> int:
        return 0

    def checkpoint_state(self, pid: int) -> int:
        return 0


def make_cuda(dry: bool) -> Cuda:
    return FakeCuda() if dry else Cuda()
