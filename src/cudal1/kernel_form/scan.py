"""Scan a built candidate: the cubin's ELF tables and the PTX of the same NVRTC program.

Rejections (the candidate is refused):
- not a 64-bit CUDA ELF, or not an executable cubin (a relocatable one comes from `-rdc`: device code meant to be
  linked, the way to dynamic parallelism);
- a symbol of the device runtime (`cudaLaunchDevice*`, `cudaGetParameterBuffer*`, `__cudaCDP*`, ...) or any
  undefined function symbol in the cubin, or a call of one in the PTX.
Flags (reported, the verdict's policy decides): reads of `%globaltimer` (`_lo`, `_hi`) or `%clock`/`%clock64` in
the PTX, which only serve to tell calls apart (phase detection); with `cuobjdump` on PATH, the same reads in the
SASS (`SR_GLOBALTIMER*`, `SR_CLOCK*`).

Why the PTX is enough for timer reads: NVRTC compiles source to PTX and PTX to SASS in one program, and inline
assembly is PTX, so every special-register read of the cubin appears in that PTX. The ELF parser reads only the
header, the section headers and the symbol tables, bounds-checked, and never executes anything.
"""

from __future__ import annotations

import logging
import re
import shutil
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

EM_CUDA = 190
ET_EXEC = 2
SHT_SYMTAB = 2
STT_FUNC = 2
SHN_UNDEF = 0
MAX_SYMBOLS = 100_000
SASS_TIMEOUT_S = 60.0

DEVICE_RUNTIME = re.compile(r"cudaLaunchDevice|cudaGetParameterBuffer|cudaCDP|__cudaCDP|cudaDeviceSynchronize"
                            r"|cudaCGGetIntrinsicHandle|cudaStreamCreateWithFlags|cudaGraphLaunch|cudaMalloc"
                            r"|cudaEventRecord|cudaStreamDestroy|__cudaCDP2")
PTX_CALL = re.compile(r"\bcall(?:\.uni)?\b[^;]*?\b(?P<name>(?:__)?cuda\w+)")
PTX_TIMERS = {"%globaltimer": re.compile(r"%globaltimer(?:_lo|_hi)?\b"), "%clock": re.compile(r"%clock(?:64)?\b")}
SASS_TIMERS = {"%globaltimer": re.compile(r"SR_GLOBALTIMER"), "%clock": re.compile(r"SR_CLOCK")}


@dataclass
class ScanReport:
    """What the scan found: `rejections` refuse the candidate, `flags` are reported."""

    kernels: list[str] = field(default_factory=list)  # FUNC symbols defined in the cubin
    rejections: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    sass_scanned: bool = False  # cuobjdump was found and read the cubin
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.rejections

    def to_dict(self) -> dict[str, object]:
        return {"kernels": self.kernels, "rejections": self.rejections, "flags": self.flags,
                "sass_scanned": self.sass_scanned, "seconds": round(self.seconds, 6)}


class _Elf:
    def __init__(self, data: bytes):
        self.data = data

    def unpack(self, fmt: str, offset: int) -> tuple:
        size = struct.calcsize(fmt)
        if offset < 0 or offset + size > len(self.data):
            raise ValueError(f"reads past the end of the file (offset {offset})")
        return struct.unpack_from(fmt, self.data, offset)

    def cstring(self, offset: int) -> str:
        if not 0 <= offset < len(self.data):
            raise ValueError(f"a name offset {offset} outside the file")
        end = self.data.find(b"\0", offset, offset + 4096)
        return self.data[offset:end if end >= 0 else offset + 4096].decode("latin-1")


def elf_symbols(cubin: bytes) -> tuple[int, list[tuple[str, int, int, int]]]:
    """(e_type, [(name, type, bind, section index)]) of a 64-bit little-endian CUDA ELF; ValueError when the bytes
    are not one."""
    elf = _Elf(cubin)
    if cubin[:4] != b"\x7fELF" or len(cubin) < 64 or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    e_type, machine = elf.unpack("<HH", 16)
    if machine != EM_CUDA:
        raise ValueError(f"an ELF file for machine {machine}, not CUDA ({EM_CUDA})")
    (shoff,) = elf.unpack("<Q", 0x28)
    shentsize, shnum = elf.unpack("<HH", 0x3A)
    if shentsize != 64 or shnum > 65535:
        raise ValueError("malformed section headers")
    sections = [elf.unpack("<IIQQQQIIQQ", shoff + i * 64) for i in range(shnum)]
    symbols: list[tuple[str, int, int, int]] = []
    for sec in sections:
        if sec[1] != SHT_SYMTAB:
            continue
        offset, size, link, entsize = sec[4], sec[5], sec[6], sec[9]
        if entsize != 24 or link >= len(sections) or size // 24 > MAX_SYMBOLS:
            raise ValueError("malformed symbol table")
        strtab = sections[link][4]
        for k in range(1, size // 24):
            st_name, st_info, _other, st_shndx, _value, _size = elf.unpack("<IBBHQQ", offset + k * 24)
            symbols.append((elf.cstring(strtab + st_name), st_info & 0xF, st_info >> 4, st_shndx))
    return e_type, symbols


def _sass(cubin: bytes) -> str | None:
    tool = shutil.which("cuobjdump")
    if tool is None:
        return None
    with tempfile.TemporaryDirectory(prefix="cudal1-scan-") as tmp:
        path = Path(tmp, "kernel.cubin")
        path.write_bytes(cubin)
        try:
            proc = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, timeout=SASS_TIMEOUT_S)
        except (subprocess.TimeoutExpired, OSError) as exc:
            logger.warning("kernel_form: cuobjdump failed: %s", exc)
            return None
    return proc.stdout if proc.returncode == 0 else None


def scan_build(cubin: bytes, ptx: str, *, use_sass: bool = True) -> ScanReport:
    """Scan a cubin and the PTX it was built from (see the module docstring for the rules)."""
    start = time.perf_counter()
    report = ScanReport()
    try:
        e_type, symbols = elf_symbols(cubin)
    except (ValueError, struct.error) as exc:
        report.rejections.append(f"the build is not a CUDA cubin: {exc}")
        report.seconds = time.perf_counter() - start
        return report
    if e_type != ET_EXEC:
        report.rejections.append(f"a relocatable cubin (ELF type {e_type}): device code built for linking (-rdc), "
                                 "which device-side launches need, is not allowed")
    runtime = sorted({name for name, *_ in symbols if DEVICE_RUNTIME.search(name)})
    if runtime:
        report.rejections.append(f"device-runtime symbols (dynamic parallelism): {', '.join(runtime[:5])}")
    undefined = sorted({name for name, kind, bind, shndx in symbols
                        if shndx == SHN_UNDEF and kind == STT_FUNC and name not in runtime})
    if undefined:
        report.rejections.append(f"unresolved device functions: {', '.join(undefined[:5])}")
    report.kernels = sorted({name for name, kind, bind, shndx in symbols
                             if kind == STT_FUNC and shndx != SHN_UNDEF and bind == 1})
    calls = sorted({m.group("name") for m in PTX_CALL.finditer(ptx) if DEVICE_RUNTIME.search(m.group("name"))})
    if calls and not runtime:
        report.rejections.append(f"the PTX calls the device runtime (dynamic parallelism): {', '.join(calls[:5])}")
    for what, pattern in PTX_TIMERS.items():
        if pattern.search(ptx):
            report.flags.append(f"reads {what} (PTX)")
    sass = _sass(cubin) if use_sass else None
    if sass is not None:
        report.sass_scanned = True
        for what, pattern in SASS_TIMERS.items():
            if pattern.search(sass) and f"reads {what} (PTX)" not in report.flags:
                report.flags.append(f"reads {what} (SASS)")
    report.seconds = time.perf_counter() - start
    return report
