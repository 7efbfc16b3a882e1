"""Chunk records: what one GPU run of an audit measured, as compact JSON lines that can be committed.

    with ChunkWriter(out_dir / "h100-20261207T101500Z.jsonl", header) as chunk:
        chunk.result(result, task, candidate_hash)      # one line per evaluation, written as it comes
        chunk.baseline(record)                           # one line per baseline measured
    chunks = read_chunks("docs/audit/cuda-l1-releases/chunks")

A record holds no source code and no binaries: per evaluation its verdict under the evidence profile, the
flags (rule, severity, source, line, a short message), the kernel class, the mismatch, the timing figures,
where stricter profiles would have stopped (`stops`), how far it got (`reached`) and its duration; per
baseline its status, time and speedup vs eager. The first line (`kind: chunk`) states the card and its state
as found (clocks, temperature, power, memory in use: NVML, else nvidia-smi, else nothing), the machine's
software, the protocol, the code (commit when known, and a hash of the package's source files) and the
release (name and hash of its file); the last (`kind: end`) the card's state after, the elapsed time and what
was left for a later run. Every line is flushed as written, so a run cut short leaves what it measured (its
elapsed time is then that of its last line, `t_s`).

Limits: the card's state is sampled twice per chunk, not watched; a record trusts the machine that wrote it
(it is data from our own evaluator, not from a candidate).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.core.errors import SourceError
from cudal1.core.types import EvalResult

logger = logging.getLogger(__name__)

#: Bumped when a record's fields change meaning.
RECORD_VERSION = 1
MESSAGE_CHARS = 300
FLAG_MESSAGE_CHARS = 200
_TIMING_KEYS = ("ref_ms", "candidate_ms", "speedup", "speedup_warm", "ref_ms_warm", "candidate_ms_warm",
                "stability", "speedup_ci", "iterations", "verified_calls", "method")


def _short(text: str, chars: int) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return " / ".join(lines[:3])[:chars]


def compact_result(result: EvalResult, *, task_id: str, task_hash: str, candidate_hash: str) -> dict[str, Any]:
    """One evaluation as a record line: what every view's verdict and the report need, nothing more."""
    timing = None
    if result.timing is not None:
        timing = {k: getattr(result.timing, k) for k in _TIMING_KEYS}
    protocol = result.protocol or {}
    phases = {k: round(v, 3) for k, v in (protocol.get("phase_s") or {}).items() if isinstance(v, float)}
    return {
        "kind": "result", "task_id": task_id, "task_hash": task_hash, "candidate_hash": candidate_hash,
        "status": result.status.value, "message": _short(result.message, MESSAGE_CHARS),
        "speedup": result.speedup, "kernel_class": result.kernel_class.value if result.kernel_class else None,
        "flags": [{"rule": f.rule, "severity": f.severity.value, "source": f.source, "line": f.line,
                   "message": _short(f.message, FLAG_MESSAGE_CHARS)} for f in result.flags],
        "mismatch": _mismatch(result), "timing": timing,
        "stops": [{**stop, "mismatch": _plain(stop.get("mismatch"))} for stop in protocol.get("stops") or []],
        "reached": protocol.get("reached", ""), "builds": protocol.get("builds") or [],
        "profile": protocol.get("profile"), "protocol_version": str(protocol.get("version", "")),
        "duration_s": None if result.duration_s is None else round(result.duration_s, 3), "phase_s": phases,
    }


def _mismatch(result: EvalResult) -> dict[str, Any] | None:
    if result.mismatch is None:
        return None
    import dataclasses

    return _plain(dataclasses.asdict(result.mismatch))


def _plain(value: Any) -> Any:
    """Floats that JSON can hold (NaN and infinities as strings)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    return value


def compact_baseline(record: Any) -> dict[str, Any]:
    """One baseline (`BaselineRecord`) as a record line."""
    return {"kind": "baseline", "task_id": record.task_id, "task_hash": record.task_hash, "name": record.name,
            "status": record.status, "ms": record.ms, "speedup_vs_eager": record.speedup_vs_eager,
            "ref_ms": record.ref_ms, "measured_speedup": record.measured_speedup,
            "reason": _short(record.reason, MESSAGE_CHARS)}


# --------------------------------------------------------------------------- the card and the code


_SMI_FIELDS = {"clocks.sm": "sm_clock_mhz", "clocks.mem": "memory_clock_mhz", "clocks.max.sm": "max_sm_clock_mhz",
               "temperature.gpu": "temperature_c", "power.draw": "power_w", "power.limit": "power_limit_w",
               "pstate": "pstate", "memory.used": "memory_used_mib", "memory.total": "memory_total_mib",
               "driver_version": "driver", "persistence_mode": "persistence_mode",
               "clocks_event_reasons.active": "clock_event_reasons"}


def card_state(device: str) -> dict[str, Any]:
    """The GPU's clocks, temperature, power and memory in use as found now (NVML, else nvidia-smi); `{}` on the
    CPU or when neither answers. `source` says which answered."""
    if not device.startswith("cuda"):
        return {}
    index = int(device.split(":")[1]) if ":" in device else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if visible and visible.split(",")[0].strip().isdigit():
        index = int(visible.split(",")[index].strip()) if index < len(visible.split(",")) else index
    return _nvml_state(index) or _smi_state(index)


def _nvml_state(index: int) -> dict[str, Any]:
    try:
        import pynvml  # noqa: PLC0415 - optional: nvidia-ml-py, present on GPU hosts
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(h)
            state = {"source": "nvml", "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                     "memory_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                     "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                     "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                     "power_w": round(pynvml.nvmlDeviceGetPowerUsage(h) / 1000, 1),
                     "pstate": f"P{pynvml.nvmlDeviceGetPerformanceState(h)}",
                     "memory_used_mib": memory.used // 2**20, "memory_total_mib": memory.total // 2**20}
            driver = pynvml.nvmlSystemGetDriverVersion()
            state["driver"] = driver.decode() if isinstance(driver, bytes) else driver
            return state
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - a state we cannot read is left out, never a failed chunk
        logger.info("NVML did not answer", exc_info=True)
        return {}


def _smi_state(index: int) -> dict[str, Any]:
    if shutil.which("nvidia-smi") is None:
        return {}
    state: dict[str, Any] = {"source": "nvidia-smi"}
    for name, key in _SMI_FIELDS.items():  # one query per field: an unknown field fails its query only
        try:
            done = subprocess.run(["nvidia-smi", f"--id={index}", f"--query-gpu={name}",
                                   "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return {}
        value = done.stdout.strip()
        if done.returncode == 0 and value and "not supported" not in value.lower():
            state[key] = _number(value)
    return state if len(state) > 1 else {}


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def code_hash(package_dir: str | Path | None = None) -> str:
    """sha256 over the package's Python files (relative path and content, sorted): the code that measured,
    also where no git checkout is at hand."""
    root = Path(package_dir) if package_dir is not None else Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def git_commit(root: str | Path) -> str | None:
    """HEAD of the checkout at `root` (with `+dirty` when its tracked files differ), or None without git."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=20)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --------------------------------------------------------------------------- writing and reading


class ChunkWriter:
    """Writes one chunk record line by line (each flushed to disk as written)."""

    def __init__(self, path: str | Path, header: Mapping[str, Any]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.lines = 0
        self.protocol = dict(header.get("protocol") or {})
        self._handle = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._write({"kind": "chunk", "record_version": RECORD_VERSION, **header})

    def _write(self, line: Mapping[str, Any]) -> None:
        self._handle.write(json.dumps(_plain(dict(line)), sort_keys=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.lines += 1

    def elapsed_s(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def result(self, result: EvalResult, *, task_id: str, task_hash: str, candidate_hash: str) -> None:
        line = compact_result(result, task_id=task_id, task_hash=task_hash, candidate_hash=candidate_hash)
        # A verdict given before any protocol applied (a text that is no source file) is the chunk's.
        line["profile"] = line["profile"] or self.protocol.get("profile")
        line["protocol_version"] = line["protocol_version"] or str(self.protocol.get("version", ""))
        self._write({**line, "t_s": self.elapsed_s()})

    def baseline(self, record: Any) -> None:
        self._write({**compact_baseline(record), "t_s": self.elapsed_s()})

    def end(self, **facts: Any) -> None:
        self._write({"kind": "end", "elapsed_s": self.elapsed_s(), **facts})

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class Chunk:
    """One chunk record read back."""

    path: Path
    header: dict[str, Any]
    results: list[dict[str, Any]] = field(default_factory=list)
    baselines: list[dict[str, Any]] = field(default_factory=list)
    end: dict[str, Any] | None = None

    @property
    def release(self) -> str:
        return str(self.header.get("release", ""))

    @property
    def gpu_name(self) -> str:
        return str((self.header.get("environment") or {}).get("gpu_name", "?"))

    @property
    def protocol_version(self) -> str:
        return str((self.header.get("protocol") or {}).get("version", ""))

    @property
    def elapsed_s(self) -> float:
        """The run's wall time: its end line's, else its last line's (a run cut short)."""
        if self.end is not None:
            return float(self.end.get("elapsed_s") or 0.0)
        times = [float(line.get("t_s") or 0.0) for line in (*self.results, *self.baselines)]
        return max(times, default=0.0)

    @property
    def complete(self) -> bool:
        return self.end is not None


def read_chunk(path: str | Path) -> Chunk:
    """A chunk record; `SourceError` (one line) when it is not one. A last line cut in the middle (a run
    killed while writing) is dropped."""
    where = Path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read chunk record {where}: {exc}") from None
    lines = text.splitlines()
    parsed = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1 and not text.endswith("\n"):
                logger.warning("%s: its last line was cut short (the run ended while writing it); dropped", where)
                break
            raise SourceError(f"{where}:{i + 1}: not JSON") from None
    if not parsed or not isinstance(parsed[0], dict) or parsed[0].get("kind") != "chunk":
        raise SourceError(f"{where} is not a chunk record (its first line is not a chunk header)")
    if parsed[0].get("record_version") != RECORD_VERSION:
        raise SourceError(f"{where}: record version {parsed[0].get('record_version')!r}, this code reads "
                          f"{RECORD_VERSION}")
    chunk = Chunk(path=where, header=parsed[0])
    for line in parsed[1:]:
        kind = line.get("kind") if isinstance(line, dict) else None
        if kind == "result":
            chunk.results.append(line)
        elif kind == "baseline":
            chunk.baselines.append(line)
        elif kind == "end":
            chunk.end = line
        else:
            raise SourceError(f"{where}: unknown line kind {kind!r}")
    return chunk


def read_chunks(folder: str | Path) -> list[Chunk]:
    """Every chunk record (`*.jsonl`) in `folder`, by file name (names start with the release and the UTC
    start time); none when the folder does not exist."""
    where = Path(folder)
    return [read_chunk(p) for p in sorted(where.glob("*.jsonl"))] if where.is_dir() else []


def write_jsonl(path: str | Path, lines: Iterable[Mapping[str, Any]]) -> Path:
    """Lines of JSON, one object each (the static records)."""
    where = Path(path)
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("".join(json.dumps(_plain(dict(line))) + "\n" for line in lines), encoding="utf-8")
    return where


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    where = Path(path)
    try:
        return [json.loads(line) for line in where.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"cannot read {where}: {exc}") from None


__all__ = ["RECORD_VERSION", "Chunk", "ChunkWriter", "card_state", "code_hash", "compact_baseline",
           "compact_result", "file_hash", "git_commit", "read_chunk", "read_chunks", "read_jsonl", "write_jsonl"]
