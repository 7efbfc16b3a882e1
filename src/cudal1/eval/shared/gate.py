"""The gate and done words of the GPU clock: two 32-bit words at the end of a model's device arena, on which
its runner's stream and the trusted helper's stream wait for each other on the device.

The runner enqueues a call ahead, behind its gate: `wait(gate >= n)`, the model's work, the commit of its
outputs, `write(done = n)`. The helper, on its own stream, stages the call's inputs, records `E_start`,
writes `gate = n`, waits for `done >= n`, snapshots the output region and records `E_end`: the time between
the two events is read on the GPU's own timeline, in the helper's process, and no host activity of the
runner lies inside it. Both words are ordinary device memory that both processes map (`device_arena`): a
runner can write its own words, which only opens its own gate early or ends its own call early, as work
queued outside the gate would (docs/sandbox.md, *The GPU clock*).

The two operations are the driver's stream memory operations (`cuStreamWaitValue32`, `cuStreamWriteValue32`),
called through ctypes on a torch stream's handle.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

#: Bytes kept at the end of every device arena for the words (each on a 128-byte line of its own).
GATE_PAGE = 4096
GATE_OFFSET, DONE_OFFSET, PROBE_OFFSET = 0, 128, 256
CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0


class GateError(RuntimeError):
    """A stream memory operation failed (its name and CUresult in the message)."""


@cache
def _driver() -> Any | None:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        for fn in ("cuStreamWaitValue32_v2", "cuStreamWriteValue32_v2"):
            getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        return lib
    return None


def _call(name: str, stream: int, ptr: int, value: int, flags: int) -> None:
    lib = _driver()
    if lib is None:
        raise GateError("the CUDA driver library is not loadable")
    result = getattr(lib, name)(ctypes.c_void_p(stream), ctypes.c_uint64(ptr), value & 0xFFFFFFFF, flags)
    if result != 0:
        raise GateError(f"{name} failed with CUresult {result}")


def wait_value(stream: int, ptr: int, value: int) -> None:
    """Enqueue on `stream` (a CUstream handle, 0 for the legacy default) a wait until the word at `ptr`
    is >= `value` (32-bit, unsigned)."""
    _call("cuStreamWaitValue32_v2", stream, ptr, value, CU_STREAM_WAIT_VALUE_GEQ)


def write_value(stream: int, ptr: int, value: int) -> None:
    """Enqueue on `stream` a write of `value` into the word at `ptr` once the stream's earlier work is done."""
    _call("cuStreamWriteValue32_v2", stream, ptr, value, CU_STREAM_WRITE_VALUE_DEFAULT)


def words(base_ptr: int, size: int) -> tuple[int, int]:
    """(gate, done) device addresses of an arena mapped at `base_ptr` with `size` bytes (its last page)."""
    page = base_ptr + size - GATE_PAGE
    return page + GATE_OFFSET, page + DONE_OFFSET


def current_stream_handle(device: Any) -> int:
    """The CUstream handle of torch's current stream on `device` (0: the legacy default stream)."""
    import torch

    return int(torch.cuda.current_stream(device).cuda_stream)


def usable(device: Any, base_ptr: int, size: int) -> bool:
    """Whether this process can enqueue stream memory operations on `device`'s current stream (the one its
    calls use) on the shared page of the arena mapped at `base_ptr` (the memory its calls will wait on): a
    write of the page's probe word (neither the gate nor the done word), then a wait on it, waited for."""
    try:
        import torch

        probe = base_ptr + size - GATE_PAGE + PROBE_OFFSET
        stream = current_stream_handle(device)
        write_value(stream, probe, 7)
        wait_value(stream, probe, 7)
        torch.cuda.synchronize(device)
        return True
    except (GateError, RuntimeError, AttributeError):
        return False
