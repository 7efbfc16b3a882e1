"""The call harness both model runners share, so that reference and candidate are timed alike.

One `ModelSide` lives in each model runner (the reference's and the candidate's). It makes inputs from a
seed the parent sends (`make_inputs`: the reference's `get_inputs()` under that seed, on the device), reads
inputs the parent put in the arena, calls the model with device events around the call and a device-wide
wait inside them (`timed_call`), and writes outputs into the arena (`commit`). Nothing here decides
anything: it measures and copies, and the parent checks what it reports.

Why the same code on both sides: the parent cross-checks each runner's reported time against its own clock
around the request (`timing.clock_gaps`); the harness overhead outside the reported span must then be the
same for both models, which it is when both run this code on the same kinds of data.
"""

from __future__ import annotations

import random
import re
import time
from typing import Any

import torch

from cudal1.eval.channel import Arena, tree_nbytes

#: Bytes written to flush a CPU's last-level cache before a timed call on the CPU (in the runner itself).
CPU_FLUSH_BYTES = 32 * 2**20
#: Calls whose inputs a side keeps alive after the call, so that each call's inputs get new addresses.
KEEP_INPUTS = 2


class CallFailed(Exception):
    """The model raised (or ran out of memory) in a call: the reply names the kind and the first line."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:limit]


GIB = 2**30


def gpu_memory(device: torch.device) -> dict[str, int] | None:
    """This process's use of `device`'s memory through PyTorch's allocator, in bytes (None off the GPU):
    what is allocated now, what the allocator holds, and the peaks of both since the process started."""
    if device.type != "cuda":
        return None
    # One read of the allocator's nested statistics: the flat `memory_stats` behind `memory_allocated` and
    # its siblings rebuilds ~150 keys recursively on each read (0.4 ms of every timed call for the four).
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    allocated, reserved = stats.get("allocated_bytes", {}).get("all", {}), stats.get("reserved_bytes", {}).get("all", {})
    return {"allocated": int(allocated.get("current", 0)), "reserved": int(reserved.get("current", 0)),
            "peak_allocated": int(allocated.get("peak", 0)), "peak_reserved": int(reserved.get("peak", 0))}


def oom_message(exc: BaseException, device: torch.device) -> str:
    """An out-of-memory error in one line with the numbers that say whose memory ran out: the request, this
    process's allocated and reserved memory, and what the device had free (PyTorch's own message puts them
    on lines a first-line summary cuts off)."""
    found = re.search(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)", str(exc))
    parts = [f"tried to allocate {found.group(1)}" if found else first_line(exc, 120)]
    if device.type == "cuda":
        try:
            free, total = torch.cuda.mem_get_info(device)
            parts.append(f"this process {torch.cuda.memory_allocated(device) / GIB:.2f} GiB allocated, "
                         f"{torch.cuda.memory_reserved(device) / GIB:.2f} GiB reserved")
            parts.append(f"the device {free / GIB:.2f} of {total / GIB:.1f} GiB free")
        except Exception:  # noqa: BLE001 - a broken context: the request alone
            pass
    return "out of GPU memory (" + "; ".join(parts) + ")"


def use_device(name: str) -> torch.device:
    """`name` as a device with an index, made the current CUDA device."""
    device = torch.device(name)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    return device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seed_everything(seed: int) -> None:
    """Seed every generator a task's `get_inputs` may use (torch's CPU and CUDA generators, Python's
    `random`, NumPy). As `torch.manual_seed` does for these two devices, without its queued seeding of the
    backends this process never uses (XPU, MTIA: a stack trace recorded per call, 0.2 ms of each timed call)."""
    torch.default_generator.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def heavy_tailed(inputs: list[Any], seed: int) -> list[Any]:
    """Floating inputs with random signs and heavy-tailed magnitudes, same shapes and dtypes.

    Each element is multiplied by +-(1 + P) with P Pareto-distributed (shape 3: finite variance, values up
    to ~10x the median now and then), which breaks analytical shortcuts fitted to the reference's own
    distribution while staying in the range float32 arithmetic handles.
    """
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            gen = torch.Generator(device=x.device).manual_seed(seed)
            u = torch.rand(x.shape, generator=gen, device=x.device)
            sign = torch.where(torch.rand(x.shape, generator=gen, device=x.device) < 0.5, -1.0, 1.0)
            out.append(x * (sign * (1.0 - u).clamp_min(1e-6).pow(-1.0 / 3.0)).to(x.dtype))
        else:
            out.append(x)
    return out


def reseed_from_os() -> None:
    """torch's CPU and CUDA generators re-seeded from OS entropy (`torch.seed` for the devices in use)."""
    torch.cuda.manual_seed_all(torch.default_generator.seed())


def make_inputs(reference: Any, device: torch.device, seed: int, distribution: str = "reference") -> list[Any]:
    """The reference's inputs for `seed`, created on `device`; the generators re-seeded from OS entropy after.
    Two processes on the same kind of device make the same inputs from the same seed."""
    seed_everything(seed)
    with torch.device(device):
        inputs = list(reference.get_inputs())
    reseed_from_os()
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    if distribution == "heavy":
        inputs = heavy_tailed(inputs, seed)
    return inputs


def clone_inputs(inputs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def bit_view(x: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as the widest integer type that divides them (fast exact comparison)."""
    flat = x.detach().reshape(-1).view(torch.uint8)
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if flat.numel() % size == 0 and flat.data_ptr() % size == 0:
            return flat.view(dtype)
    return flat


def same_bytes(a: list[Any], b: list[Any]) -> bool:
    """Whether two input lists hold the same values, bit for bit (works for every dtype, NaN included)."""
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            if not isinstance(y, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                return False
            if x.numel() and not torch.equal(bit_view(x.contiguous()), bit_view(y.contiguous())):
                return False
        elif x != y:
            return False
    return True


class ModelSide:
    """A model and the means to feed it and time it, inside one runner."""

    def __init__(self, device: torch.device, reference_module: Any, model: Any = None):
        self.device = device
        self.ref = reference_module  # a `tasks.task.Reference` (its get_inputs feeds both models)
        self.model = model
        self.arena: Arena | None = None
        self._kept: list[list[Any]] = []
        self._pending: tuple[list[Any], list[Any]] | None = None
        self._cpu_flush = torch.empty(CPU_FLUSH_BYTES // 4, dtype=torch.float32) if device.type == "cpu" else None

    def make_inputs(self, seed: int, distribution: str = "reference") -> list[Any]:
        return make_inputs(self.ref, self.device, seed, distribution)

    def attach(self, arena: Arena) -> dict[str, Any]:
        """Take the arena the parent sent (pinned for the GPU where it is host memory)."""
        self.arena = arena
        return {"ok": True, "pinned": arena.register_with_cuda() if self.device.type == "cuda" else False}

    def inputs_request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Make a seed's inputs into the arena's `in` half (CPU timing: the parent ships them from there)."""
        assert self.arena is not None, "no arena attached"
        tree = self.arena.pack(self.make_inputs(int(message["seed"])), "in")
        return {"ok": True, "in": tree, "in_bytes": tree_nbytes(tree)}

    def inputs_from(self, message: dict[str, Any]) -> list[Any]:
        """The inputs a request names: made from its seed, or read from the arena where the parent put them."""
        if "seed" in message:
            return self.make_inputs(int(message["seed"]), str(message.get("distribution", "reference")))
        assert self.arena is not None, "no arena attached"
        value = self.arena.unpack(message["inputs"], device=self.device, copy=not message.get("views"))
        return list(value) if isinstance(value, (list, tuple)) else [value]

    def flush_cpu_cache(self) -> None:
        if self._cpu_flush is not None:
            self._cpu_flush.fill_(1.0)

    def call(self, inputs: list[Any]) -> Any:
        """One call of the model (no timing); failures become `CallFailed`."""
        try:
            with torch.no_grad():
                out = self.model(*inputs)
            sync(self.device)
        except torch.cuda.OutOfMemoryError as exc:
            raise CallFailed("oom", oom_message(exc, self.device)) from None
        except MemoryError as exc:
            raise CallFailed("oom", f"out of host memory: {first_line(exc, 200)}") from None
        except Exception as exc:  # noqa: BLE001 - the model's failure, reported in one line
            raise CallFailed("raised", f"forward raised {first_line(exc)}") from None
        return out

    def timed_call(self, inputs: list[Any]) -> tuple[Any, float, float]:
        """(output, total_ms, stream_ms): device events around the call with a device-wide wait inside, so
        work on any stream of this process is counted; stream_ms stops at the current stream's end."""
        try:
            with torch.no_grad():
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                    start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                    start.record()
                    out = self.model(*inputs)
                    mid.record()
                    torch.cuda.synchronize(self.device)
                    end.record()
                    end.synchronize()
                    return out, start.elapsed_time(end), start.elapsed_time(mid)
                t0 = time.perf_counter()
                out = self.model(*inputs)
                ms = (time.perf_counter() - t0) * 1e3
                return out, ms, ms
        except torch.cuda.OutOfMemoryError as exc:
            raise CallFailed("oom", oom_message(exc, self.device)) from None
        except Exception as exc:  # noqa: BLE001
            raise CallFailed("raised", f"forward raised {first_line(exc)}") from None

    def commit(self, value: Any) -> dict[str, Any]:
        """Write `value` (outputs, or outputs and inputs) into the arena's `out` half; its descriptor tree."""
        assert self.arena is not None, "no arena attached"
        sync(self.device)
        return self.arena.pack(value, "out")

    def prepare(self, message: dict[str, Any]) -> dict[str, Any]:
        """Make the next timed call's inputs (and their reference copy) ahead of it, so that a cache flush can
        come in between: the call then starts on inputs that are not in any cache."""
        inputs = self.inputs_from(message)
        # Inputs in shared memory are checked by the parent itself; only inputs made here need a copy.
        self._pending = (inputs, None if message.get("views") else clone_inputs(inputs))
        sync(self.device)
        return {"ok": True}

    def timed_request(self, message: dict[str, Any]) -> dict[str, Any]:
        """A timed call as the parent asks for it: the prepared inputs (or those the request names), the
        call, the commit of its output."""
        if self._pending is None:
            self.prepare(message)
        inputs, before = self._pending
        self._pending = None
        out, total_ms, stream_ms = self.timed_call(inputs)
        tree = self.commit(out)
        mutated = before is not None and not same_bytes(before, inputs)
        self._kept.append(inputs)  # alive until later calls: the next inputs get new addresses
        del self._kept[:-KEEP_INPUTS]
        return {"ok": True, "ms": total_ms, "stream_ms": stream_ms, "out": tree, "mutated": mutated,
                "memory": gpu_memory(self.device)}


def use_exact_fp32() -> None:
    """True fp32 for this process: TF32 off for cuDNN (PyTorch's default is on) and for matmuls."""
    b = torch.backends
    b.cudnn.allow_tf32 = False
    b.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
