"""The CUDA runtime library that torch itself loaded, for the few calls torch does not expose.

Loading libcudart by name could bind a second copy with its own error state; the one torch uses is found in
this process's memory map instead, and only then by the usual names.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any


@cache
def loaded_cudart() -> Any | None:
    """ctypes handle of the libcudart in this process (torch's), or None when there is none."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        paths = set()
    for name in (*sorted(paths), "libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def clear_last_error() -> None:
    """Reset the runtime's last error: a failed call torch did not make (a host registration) would otherwise
    be reported by torch's next kernel launch check as that kernel's failure."""
    lib = loaded_cudart()
    if lib is not None:
        lib.cudaGetLastError()


def persisting_l2_reset() -> Any | None:
    """cudaCtxResetPersistingL2Cache, or None where the runtime has none."""
    lib = loaded_cudart()
    return getattr(lib, "cudaCtxResetPersistingL2Cache", None) if lib is not None else None
