"""Speed of light: what a task must cost at least, what the device can do at most, and how close a time is.

- `task_cost(task)`: FLOPs of the reference forward, counted by `torch.utils.flop_counter.FlopCounterMode`
  on the `meta` device (no memory, no GPU: the approach of `cudal1.tasks.inspect`), and the minimum bytes
  any implementation must move: every input, every output and every parameter/buffer, each once.
- `measure_peaks(device)`: a copy-bandwidth probe (device-to-device copy, bytes read + written) and a
  matmul probe per dtype (fp32 with TF32 off, bf16, fp16), run in an isolated child and cached per GPU
  name in the store's `meta` table (`peaks/<gpu name>`).
- `sol_fraction(ms, flops, bytes, peaks)`: max(flops / peak flops, bytes / peak bandwidth) / time, the
  fraction of the physical limit a measured time reaches (1.0 = at the limit).

Limits: the flop counter knows matmuls, convolutions and attention (elementwise ops, reductions, norms and
scans count 0 FLOPs, so such tasks are judged by bytes alone, which is their real limit on GPUs); a
reference that cannot run on `meta` has unknown cost (None). Measured peaks are what simple PyTorch calls
reach (typically 85-95% of the datasheet), so a very good kernel can exceed 1.0 slightly; reports clamp.
The minimum bytes ignore compulsory re-reads (e.g. when the working set exceeds the L2 cache), so the
fraction is an upper bound on how close to the limit a kernel really is.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from cudal1.core.machine import describe_machine
from cudal1.eval.config import resolve_device
from cudal1.eval.inside.harness import use_device
from cudal1.eval.isolated import Limits, run_isolated
from cudal1.tasks.task import Task

logger = logging.getLogger(__name__)

PEAKS_ENTRY = "cudal1.baselines.sol:peaks_in_worker"
PEAKS_META_PREFIX = "peaks/"
COST_META_PREFIX = "cost/"

# Rationale: 1 GiB per copy buffer is far beyond any L2 (H200: 60 MB), so the copy runs at DRAM speed;
# 8192^3 matmuls take milliseconds on an H100/H200 at every dtype, long enough for event timing.
CUDA_COPY_BYTES = 2**30
CUDA_MATMUL_N = 8192
CPU_COPY_BYTES = 64 * 2**20
CPU_MATMUL_N = 512
PROBE_REPS = 5
MATMUL_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class TaskCost:
    """The least work a task needs: FLOPs (None if unknown) and bytes moved (None if unknown)."""

    flops: int | None
    min_bytes: int | None
    dtype: str = "float32"  # dtype that picks the matmul peak (the first floating input, else parameter)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (inverse of `from_dict`)."""
        return {"flops": self.flops, "min_bytes": self.min_bytes, "dtype": self.dtype, "note": self.note}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskCost:
        """Rebuild a cost written by `to_dict`."""
        return cls(flops=d.get("flops"), min_bytes=d.get("min_bytes"), dtype=d.get("dtype", "float32"),
                   note=d.get("note", ""))


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in _tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors(item)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def _dominant_dtype(inputs: list[torch.Tensor], params: list[torch.Tensor]) -> str:
    for t in [*inputs, *params]:
        if t.is_floating_point():
            return str(t.dtype).removeprefix("torch.")
    return "float32"


def task_cost(task: Task, sizes: str = "full") -> TaskCost:
    """FLOPs and minimum bytes of one forward of the task's reference (see the module docstring).

    Never raises for a reference that cannot be traced on `meta`: the cost is then unknown (None fields)
    and `note` says why.
    """
    from torch.utils.flop_counter import FlopCounterMode

    try:
        ref = task.load(sizes=sizes)
        init_inputs = list(ref.get_init_inputs())
        with torch.device("meta"):
            inputs = list(ref.get_inputs())
            model = ref.Model(*init_inputs)
    except Exception as exc:  # noqa: BLE001 - a reference that needs real memory has unknown cost
        return TaskCost(None, None, note=f"cannot build on meta: {type(exc).__name__}")
    in_tensors = _tensors(inputs)
    state = list(model.parameters()) + list(model.buffers()) if isinstance(model, torch.nn.Module) else []
    try:
        counter = FlopCounterMode(display=False)
        with torch.device("meta"), torch.no_grad(), counter:
            out = model(*inputs)
    except Exception as exc:  # noqa: BLE001 - ops without meta kernels: bytes of inputs/state still known
        logger.debug("meta trace of %s failed: %s", task.id, exc)
        return TaskCost(None, None, _dominant_dtype(in_tensors, state),
                        note=f"forward fails on meta: {type(exc).__name__}")
    min_bytes = _nbytes(in_tensors) + _nbytes(_tensors(out)) + _nbytes(state)
    return TaskCost(int(counter.get_total_flops()), min_bytes, _dominant_dtype(in_tensors, state))


def cached_task_cost(task: Task, sizes: str, store: Any = None) -> TaskCost:
    """`task_cost`, cached in the store's meta table per (task hash, sizes) when a store is given."""
    key = f"{COST_META_PREFIX}{task.hash}/{sizes}"
    if store is not None:
        hit = store.get_meta(key)
        if hit is not None:
            return TaskCost.from_dict(hit)
    cost = task_cost(task, sizes)
    if store is not None:
        store.put_meta(key, cost.to_dict())
    return cost


def peak_flops(peaks: dict[str, Any], dtype: str) -> float | None:
    """The measured matmul peak for `dtype` (half types share theirs; anything else uses fp32's)."""
    table = peaks.get("matmul_flops_per_s") or {}
    return table.get(dtype) or table.get("float32")


def sol_fraction(ms: float | None, flops: int | None, min_bytes: int | None, peaks: dict[str, Any] | None,
                 dtype: str = "float32") -> float | None:
    """Fraction of the physical limit that a call of `ms` milliseconds reaches (None when unknowable).

    limit_s = max(flops / peak_flops(dtype), min_bytes / copy_bytes_per_s); fraction = limit_s / (ms / 1e3).
    """
    if not ms or ms <= 0 or peaks is None or (flops is None and min_bytes is None):
        return None
    bandwidth = peaks.get("copy_bytes_per_s")
    compute = peak_flops(peaks, dtype)
    limit_s = 0.0
    if flops and compute:
        limit_s = max(limit_s, flops / compute)
    if min_bytes and bandwidth:
        limit_s = max(limit_s, min_bytes / bandwidth)
    if limit_s <= 0.0:
        return None
    return limit_s / (ms / 1e3)


# ------------------------------------------------------------------------------------------ peak probes
def _time_best_s(fn: Any, device: torch.device, reps: int) -> float:
    """Best wall time of `fn` over `reps` calls after one warm-up, with device-wide waits."""
    fn()
    best = math.inf
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            best = min(best, start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    return best


def peaks_in_worker(payload: dict[str, Any]) -> dict[str, Any]:
    """Isolated entry: measure copy bandwidth and matmul throughput on `payload["device"]`."""

    device = use_device(payload["device"])
    copy_bytes, n, reps = int(payload["copy_bytes"]), int(payload["matmul_n"]), int(payload["reps"])
    src = torch.ones(copy_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_s = _time_best_s(lambda: dst.copy_(src), device, reps)
    src = dst = torch.empty(0)  # release the buffers before the matmul probes
    matmul: dict[str, float] = {}
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 tasks are held to fp32 accuracy: no TF32 peak
    try:
        for name in MATMUL_DTYPES:
            dtype = getattr(torch, name)
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            seconds = _time_best_s(lambda: torch.mm(a, b), device, reps)  # noqa: B023 - called now
            matmul[name] = 2.0 * n**3 / seconds
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
    return {"copy_bytes_per_s": 2.0 * copy_bytes / copy_s, "matmul_flops_per_s": matmul,
            "probe": {"copy_bytes": copy_bytes, "matmul_n": n, "reps": reps, "torch_version": torch.__version__}}


def measure_peaks(device: str = "auto", store: Any = None, *, force: bool = False,
                  copy_bytes: int | None = None, matmul_n: int | None = None,
                  timeout_s: float = 300.0) -> dict[str, Any]:
    """Measured peaks of `device`, from the store's cache (`peaks/<gpu name>`) or a fresh isolated probe.

    Returns `{"gpu_name", "copy_bytes_per_s", "matmul_flops_per_s": {dtype: flops/s}, "probe"}`.
    Raises `RuntimeError` when the probe child fails (the message says how).
    """

    resolved = resolve_device(device)
    gpu_name = str(describe_machine(resolved).get("gpu_name"))
    key = PEAKS_META_PREFIX + gpu_name
    if store is not None and not force:
        hit = store.get_meta(key)
        if hit is not None:
            return hit
    on_cuda = resolved.startswith("cuda")
    payload = {"device": resolved, "reps": PROBE_REPS,
               "copy_bytes": copy_bytes or (CUDA_COPY_BYTES if on_cuda else CPU_COPY_BYTES),
               "matmul_n": matmul_n or (CUDA_MATMUL_N if on_cuda else CPU_MATMUL_N)}
    outcome = run_isolated(PEAKS_ENTRY, payload, limits=Limits(timeout_s=timeout_s, memory_bytes=None),
                           device=resolved)
    if not outcome.ok:
        raise RuntimeError(f"peak probe on {resolved} {outcome.describe_failure()}")
    peaks = {"gpu_name": gpu_name, **outcome.value}
    if store is not None:
        store.put_meta(key, peaks)
    logger.info("peaks of %s: copy %.0f GB/s, fp32 matmul %.1f TFLOP/s", gpu_name,
                peaks["copy_bytes_per_s"] / 1e9, peaks["matmul_flops_per_s"].get("float32", 0.0) / 1e12)
    return peaks


def stored_peaks(store: Any, gpu_name: str | None) -> dict[str, Any] | None:
    """Peaks cached for `gpu_name`, or None."""
    if store is None or not gpu_name:
        return None
    return store.get_meta(PEAKS_META_PREFIX + gpu_name)
