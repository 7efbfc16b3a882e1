"""GPU memory that two processes share by a file descriptor (the CUDA driver's virtual memory management).

Legacy CUDA IPC (`cudaIpcGetMemHandle`, what torch's multiprocessing uses) finds the exporting process by
its pid and fails across the sandbox's PID namespace on a container host. A `cuMemCreate` allocation
exported as a POSIX file descriptor needs no pid: the descriptor travels over the runner's socket like an
arena's memfd, and whoever holds it maps the same device memory. Only the process that created the
allocation decides who gets a descriptor.

`SharedDeviceBuffer.create` allocates and exports (the trusted side); `SharedDeviceBuffer.attach` maps a
received descriptor. `tensor()` is a torch uint8 view of the mapping (no copy). Needs a driver with VMM
(CUDA 10.2+) and POSIX descriptor handles (Linux); `available()` says whether this process has both.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from typing import Any

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class VmmError(RuntimeError):
    """A driver call failed (its name and CUresult in the message)."""


@cache
def _driver() -> Any | None:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _check(name: str, *args: Any) -> None:
    lib = _driver()
    if lib is None:
        raise VmmError("the CUDA driver library is not loadable")
    result = getattr(lib, name)(*args)
    if result != 0:
        raise VmmError(f"{name} failed with CUresult {result}")


def _device_ordinal() -> int:
    """The current device, with torch's (primary) context made current on it: driver calls need one."""
    import torch

    ordinal = torch.cuda.current_device()
    _context_on(ordinal)
    return ordinal


@cache
def _context_on(ordinal: int) -> None:
    import torch

    torch.zeros(1, device=f"cuda:{ordinal}")  # creates the context where torch had not yet


def available() -> bool:
    """Whether this process can create and share device memory by descriptor."""
    try:
        import torch

        if not torch.cuda.is_available() or _driver() is None:
            return False
        ordinal = _device_ordinal()
        device, value = ctypes.c_int(), ctypes.c_int()
        _check("cuDeviceGet", ctypes.byref(device), ordinal)
        for attribute in (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                          CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED):
            _check("cuDeviceGetAttribute", ctypes.byref(value), attribute, device)
            if not value.value:
                return False
        return True
    except (VmmError, RuntimeError, AttributeError):
        return False


def _prop(ordinal: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location = _Location(CU_MEM_LOCATION_TYPE_DEVICE, ordinal)
    return prop


def granularity() -> int:
    """The allocation granularity of this device (sizes are rounded up to it)."""
    ordinal = _device_ordinal()
    prop, size = _prop(ordinal), ctypes.c_size_t()
    _check("cuMemGetAllocationGranularity", ctypes.byref(size), ctypes.byref(prop), CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    return int(size.value)


class SharedDeviceBuffer:
    """One device allocation mapped into this process; shareable by `fd` when this process created it."""

    def __init__(self, handle: int, size: int, ordinal: int, fd: int | None):
        self.handle, self.size, self.ordinal, self.fd = handle, size, ordinal, fd
        self.ptr = 0
        self._tensor: Any = None
        ptr = ctypes.c_uint64()
        _check("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
               ctypes.c_uint64(0), ctypes.c_ulonglong(0))
        try:
            _check("cuMemMap", ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_ulonglong(handle),
                   ctypes.c_ulonglong(0))
            access = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, ordinal), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            _check("cuMemSetAccess", ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1))
        except VmmError:
            _driver().cuMemUnmap(ptr, ctypes.c_size_t(size))
            _driver().cuMemAddressFree(ptr, ctypes.c_size_t(size))
            _driver().cuMemRelease(ctypes.c_ulonglong(handle))
            raise
        self.ptr = int(ptr.value)

    @classmethod
    def create(cls, nbytes: int) -> SharedDeviceBuffer:
        """A new allocation of at least `nbytes` on the current device, exported as a descriptor (`fd`)."""
        ordinal = _device_ordinal()
        step = granularity()
        size = max(step, -(-int(nbytes) // step) * step)
        prop, handle = _prop(ordinal), ctypes.c_ulonglong()
        _check("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0))
        fd = ctypes.c_int(-1)
        try:
            _check("cuMemExportToShareableHandle", ctypes.byref(fd), handle,
                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, ctypes.c_ulonglong(0))
        except VmmError:
            _driver().cuMemRelease(handle)
            raise
        os.set_inheritable(fd.value, False)
        return cls(int(handle.value), size, ordinal, fd.value)

    @classmethod
    def attach(cls, fd: int, size: int) -> SharedDeviceBuffer:
        """Map a received descriptor of an allocation of `size` bytes (the creator's size, a multiple of the
        granularity). The descriptor is closed here: the mapping keeps the memory alive."""
        ordinal = _device_ordinal()
        handle = ctypes.c_ulonglong()
        try:
            _check("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd),
                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        finally:
            os.close(fd)
        return cls(int(handle.value), int(size), ordinal, None)

    def tensor(self) -> Any:
        """A torch uint8 tensor over the whole mapping (no copy; valid while this buffer is open)."""
        import torch

        if self._tensor is None:
            view = _CudaArray(self.ptr, self.size)
            self._tensor = torch.as_tensor(view, device=f"cuda:{self.ordinal}")
        return self._tensor

    def take_descriptor(self) -> int | None:
        """The exported descriptor, handed over to the caller (who closes it once sent): the mapping keeps
        the memory alive without it."""
        fd, self.fd = self.fd, None
        return fd

    def close_descriptor(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def close(self) -> None:
        """Unmap and release (the memory itself lives until every process that maps it let go)."""
        lib = _driver()
        self._tensor = None
        if self.ptr and lib is not None:
            lib.cuMemUnmap(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size))
            lib.cuMemAddressFree(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size))
            lib.cuMemRelease(ctypes.c_ulonglong(self.handle))
            self.ptr = 0
        self.close_descriptor()


class _CudaArray:
    """The `__cuda_array_interface__` of a raw device range, for `torch.as_tensor`."""

    def __init__(self, ptr: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}
