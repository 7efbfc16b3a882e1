"""Build CUDA C++ source to a cubin with NVRTC (ctypes), as the kernel-only form's build child would.

    python tt_nvrtc.py SOURCE.cu [--arch sm_90]

Prints one JSON object: {"ok", "lib", "version", "ms", "log", "cubin_b64"}. Needs no GPU: it runs on the
CPU machine too (E5's build step, and the tests).
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import glob
import json
import os
import site
import sys
import time
from typing import Any


def nvrtc_candidates() -> list[str]:
    roots = [*site.getsitepackages(), site.getusersitepackages(), *[p for p in sys.path if p.endswith("site-packages")]]
    found: list[str] = []
    for root in roots:
        for pattern in ("nvidia/*/lib/libnvrtc.so*", "nvidia/cuda_nvrtc/lib/libnvrtc.so*", "nvidia/cu*/lib/libnvrtc.so*"):
            found += sorted(glob.glob(os.path.join(root, pattern)))
    for pattern in ("/usr/local/cuda*/lib64/libnvrtc.so*", "/usr/local/cuda*/targets/x86_64-linux/lib/libnvrtc.so*",
                    "/usr/lib/x86_64-linux-gnu/libnvrtc.so*"):
        found += sorted(glob.glob(pattern))
    found = [f for f in found if "builtins" not in os.path.basename(f) and "alt" not in os.path.basename(f)]
    lib = ctypes.util.find_library("nvrtc")
    return [*found, *([lib] if lib else []), "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]


def load_nvrtc() -> tuple[Any, str]:
    errors = []
    for name in nvrtc_candidates():
        try:
            return ctypes.CDLL(name), name
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise OSError("no libnvrtc: " + "; ".join(errors[-4:]))


def compile_source(source: str, arch: str = "sm_90", name: str = "candidate.cu") -> dict[str, Any]:
    lib, path = load_nvrtc()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    prog = ctypes.c_void_p()
    t0 = time.perf_counter()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    if rc != 0:
        return {"ok": False, "lib": path, "error": f"nvrtcCreateProgram {rc}"}
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value + 1)
    lib.nvrtcGetProgramLog(prog, log)
    out: dict[str, Any] = {"lib": path, "version": f"{major.value}.{minor.value}", "log": log.value.decode(errors="replace")[-2000:]}
    if rc == 0:
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        rc2 = lib.nvrtcGetCUBIN(prog, cubin)
        out.update(ok=rc2 == 0 and size.value > 0, cubin=cubin.raw)
    else:
        out.update(ok=False, error=f"nvrtcCompileProgram {rc}")
    out["ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return out


def main() -> None:
    args = sys.argv[1:]
    arch = "sm_90"
    if "--arch" in args:
        i = args.index("--arch")
        arch = args[i + 1]
        del args[i:i + 2]
    with open(args[0]) as f:
        source = f.read()
    try:
        out = compile_source(source, arch, os.path.basename(args[0]))
    except OSError as exc:
        out = {"ok": False, "error": str(exc)}
    cubin = out.pop("cubin", None)
    if cubin:
        out["cubin_b64"] = base64.b64encode(cubin).decode()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
