"""Build a kernel-form candidate's source with NVRTC, in this process, and scan the result.

    value = build_in_child({"source": ..., "options": [...], "arch": "sm_90"})   # the sandboxed child's body
    build = finish_build(spec, value, arch, started)     # KernelBuildError / KernelRejectedError on failure
    build.cubin, build.scan.flags, build.wall_s

The evaluator runs `build_in_child` in a sandboxed child process (`cudal1.eval.kernel_build.build_kernel_form`,
through `cudal1.eval.isolated.run_isolated`: its limits, and a compiler crash, hang or memory bomb ends the child,
never the caller); `build_here` does the same in this process (trusted sources only, e.g. tests). The recipe is
the raw-CUDA form's (its `<cstdint>`, `<cmath>` stand-ins and prelude, the toolkit's include folders,
`-std=c++17`), plus the spec's whitelisted options; never `-rdc` and no cudadevrt, so a kernel launch in device
code does not compile. No GPU is needed. This half imports nothing of the evaluator, so the evaluator can use it.
"""

from __future__ import annotations

import base64
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from cudal1.kernel_form.errors import KernelBuildError, KernelRejectedError
from cudal1.kernel_form.scan import ScanReport, scan_build
from cudal1.kernel_form.spec import KernelFormSpec

logger = logging.getLogger(__name__)

BUILD_ENTRY = "cudal1.kernel_form.build:build_in_child"
DEFAULT_ARCH = "sm_90"
SOURCE_NAME = "kernel.cu"
MAX_PTX_CHARS = 16 * 2**20


@dataclass(frozen=True)
class KernelBuild:
    """A scanned cubin and how it was obtained."""

    cubin: bytes
    ptx: str
    log: str  # compiler warnings
    arch: str
    compiler: str  # "nvrtc 13.0"
    compile_s: float  # NVRTC's time inside the child (0 when the cubin came from the build cache)
    wall_s: float  # the whole build, child start-up and scan included
    scan: ScanReport
    cached: bool = False  # the child's reply came from the build cache (`eval.kernel_build`): no compile ran


def _nvrtc_compile(source: str, options: list[str], arch: str) -> dict[str, Any]:
    """Compile in this process (the child's body); a JSON-able dict with the cubin in base64 or the error."""
    from cudal1.raw_cuda.compiler import cuda_bindings, cuda_include_dirs, nvrtc_version
    from cudal1.raw_cuda.errors import trim_compile_log
    from cudal1.raw_cuda.shims import NVRTC_PRELUDE, NVRTC_SHIM_HEADERS

    nvrtc = cuda_bindings("nvrtc", "building kernel-form candidates")
    start = time.perf_counter()
    names = [n.encode() for n in NVRTC_SHIM_HEADERS]
    bodies = [b.encode() for b in NVRTC_SHIM_HEADERS.values()]
    text = NVRTC_PRELUDE.format(name=SOURCE_NAME) + source
    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), SOURCE_NAME.encode(), len(names), bodies, names)
    if int(err) != 0:
        return {"ok": False, "error": f"nvrtcCreateProgram failed ({int(err)})", "log": ""}
    try:
        opts = [f"--gpu-architecture={arch}", "-std=c++17", *(f"-I{d}" for d in cuda_include_dirs()), *options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.replace(b"\x00", b"").decode(errors="replace").strip()
        if int(err) != 0:
            detail = log or nvrtc.nvrtcGetErrorString(err)[1].decode()
            return {"ok": False, "error": trim_compile_log(detail), "log": detail[-20000:]}
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = bytearray(size)
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = bytearray(size)
        nvrtc.nvrtcGetPTX(prog, ptx)
        return {"ok": True, "cubin_b64": base64.b64encode(bytes(cubin)).decode(), "log": log[-20000:],
                "ptx": ptx.replace(b"\x00", b"").decode(errors="replace")[:MAX_PTX_CHARS],
                "compiler": f"nvrtc {nvrtc_version()}", "compile_s": time.perf_counter() - start}
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def build_in_child(payload: dict[str, Any]) -> dict[str, Any]:
    """The sandboxed child's entry: payload {"source", "options", "arch"}."""
    return _nvrtc_compile(str(payload["source"]), [str(o) for o in payload["options"]], str(payload["arch"]))


def check_arch(arch: str) -> None:
    """KernelBuildError unless `arch` is a CUBIN target such as 'sm_90'."""
    if not re.fullmatch(r"sm_\d{2,3}a?", arch):
        raise KernelBuildError(f"arch {arch!r} is not a CUBIN target such as 'sm_90'")


def build_payload(spec: KernelFormSpec, arch: str) -> dict[str, Any]:
    """What the build child is given (`build_in_child`)."""
    return {"source": spec.source, "options": list(spec.options), "arch": arch}


def finish_build(spec: KernelFormSpec, value: dict[str, Any], arch: str, started: float,
                 cached: bool = False) -> KernelBuild:
    """The child's reply made a scanned `KernelBuild` (`started`: `time.perf_counter()` at the build's start;
    `cached`: the reply came from the build cache, scanned again all the same). Raises KernelBuildError (a
    compile error; a step naming a kernel the cubin does not define) or KernelRejectedError (the scan refused
    the cubin)."""
    if not value.get("ok"):
        raise KernelBuildError(str(value.get("error") or "the build failed"), log=str(value.get("log", "")))
    cubin = base64.b64decode(value["cubin_b64"])
    scan = scan_build(cubin, str(value.get("ptx", "")))
    wall_s = time.perf_counter() - started
    if not scan.ok:
        raise KernelRejectedError("; ".join(scan.rejections))
    missing = [s.kernel for s in spec.steps if s.kernel not in scan.kernels]
    if missing:
        raise KernelBuildError(f"the cubin defines no kernel {missing[0]!r} (it has: {', '.join(scan.kernels)})")
    logger.debug("kernel_form: built %d bytes for %s in %.3f s (scan %.4f s)", len(cubin), arch, wall_s, scan.seconds)
    return KernelBuild(cubin, str(value.get("ptx", "")), str(value.get("log", "")), arch,
                       str(value.get("compiler", "nvrtc")), 0.0 if cached else float(value.get("compile_s", 0.0)),
                       wall_s, scan, cached)


def build_here(spec: KernelFormSpec, *, arch: str = DEFAULT_ARCH) -> KernelBuild:
    """Build `spec.source` for `arch` in this process and scan it (trusted sources only: no sandbox)."""
    check_arch(arch)
    started = time.perf_counter()
    return finish_build(spec, build_in_child(build_payload(spec, arch)), arch, started)
